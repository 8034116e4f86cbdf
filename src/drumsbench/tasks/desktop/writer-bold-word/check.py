def check(doc, ctx):
    paras = ctx.paragraphs(doc)
    texts = [p.getString() for p in paras]
    if texts != ["Only verified rollouts count."]:
        return False, f"paragraphs: {texts!r}"
    bold = ctx.bold_words(paras[0])
    return bold == ["verified"], f"bold words: {bold!r}"
