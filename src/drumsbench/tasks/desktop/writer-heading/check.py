def check(doc, ctx):
    paras = ctx.paragraphs(doc)
    got = [(p.getString(), p.ParaStyleName) for p in paras]
    want_text = ["Results", "All rollouts were verified before training."]
    if [t for t, _ in got] != want_text:
        return False, f"paragraphs changed: {got!r}"
    ok = got[0][1] == "Heading 1" and not got[1][1].startswith("Heading")
    return ok, f"styles: {[s for _, s in got]!r}"
