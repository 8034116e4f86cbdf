def check(doc, ctx):
    values = [ctx.cell(doc, f"A{r}").getValue() for r in (1, 2, 3)]
    a4 = ctx.cell(doc, "A4")
    formula = a4.getFormula().replace(" ", "").upper()
    ok = values == [12.0, 30.0, 58.0] and formula == "=SUM(A1:A3)" and a4.getValue() == 100.0
    return ok, f"A1:A3={values!r} A4 formula={a4.getFormula()!r} value={a4.getValue()!r}"
