def check(doc, ctx):
    names = ctx.column_strings(doc, "A", 1, 6)
    want = ["Apple", "Banana", "Cherry", "Mango", "Pear", ""]
    return names == want, f"A1:A6 = {names!r}"
