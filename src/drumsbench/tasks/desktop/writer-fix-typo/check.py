def check(doc, ctx):
    texts = ctx.texts(doc)
    return texts == ["The report is ready."], f"paragraphs: {texts!r}"
