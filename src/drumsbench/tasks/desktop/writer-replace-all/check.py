def check(doc, ctx):
    texts = ctx.texts(doc)
    want = ["The color of the chart matches the color of the logo.", "Pick one color per series."]
    return texts == want, f"paragraphs: {texts!r}"
