import re

FILE_ONLY = True  # reads the stored file: also valid after the policy closed LibreOffice


def check(doc, ctx):
    xml = ctx.stored_zip_text("report.docx", "word/document.xml")
    if not xml:
        return False, "report.docx missing or not a Word document"
    runs = re.findall(r"<w:r>(.*?)</w:r>|<w:r [^>]*>(.*?)</w:r>", xml, re.S)
    bold_2025 = any("2025" in (a or b) and re.search(r"<w:b/>|<w:b w:val=\"(true|1)\"/>", a or b) for a, b in runs)
    text = "".join(re.findall(r"<w:t[^>]*>([^<]*)</w:t>", xml))
    return text == "Budget approved for 2025." and bold_2025, f"text {text!r}; 2025 bold: {bold_2025}"
