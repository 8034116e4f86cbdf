def check(doc, ctx):
    tables = doc.getTextTables()
    if tables.getCount() != 1:
        return False, f"{tables.getCount()} tables"
    t = tables.getByIndex(0)
    cols, rows = t.getColumns().getCount(), t.getRows().getCount()
    texts = ctx.texts(doc)
    return (cols, rows) == (3, 2) and texts[:1] == ["Quarterly figures:"], f"table {cols}x{rows}; paragraphs {texts!r}"
