BOLD = 150.0


def check(doc, ctx):
    weights = {name: float(ctx.cell(doc, name).CharWeight) for name in ("A1", "B1", "C1", "A2", "B2", "C2")}
    header = all(weights[n] >= BOLD for n in ("A1", "B1", "C1"))
    rest = all(weights[n] < BOLD for n in ("A2", "B2", "C2"))
    texts = [ctx.cell(doc, n).getString() for n in ("A1", "B1", "C1")]
    ok = header and rest and texts == ["Task", "Steps", "Reward"]
    return ok, f"weights {weights!r}; header {texts!r}"
