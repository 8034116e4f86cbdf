"""Deterministic OpenDocument files (.odt / .ods) built from a body fragment.

Task suites keep their start documents as readable XML (the inside of ``<office:text>`` or
``<office:spreadsheet>``); ``build(app, body)`` packs them into a minimal, valid ODF zip with fixed
timestamps, so the same body always gives the same bytes and so the same start fingerprint.
"""

from __future__ import annotations

import io
import zipfile

NS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
    'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
    'xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0" '
    'xmlns:of="urn:oasis:names:tc:opendocument:xmlns:of:1.2" '
    'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0" '
    'office:version="1.3"'
)

APPS = {
    "writer": ("application/vnd.oasis.opendocument.text", "text", ".odt"),
    "calc": ("application/vnd.oasis.opendocument.spreadsheet", "spreadsheet", ".ods"),
}

# Writer: a bold character style the start documents may use (``<text:span text:style-name="B">``).
AUTO_STYLES = {
    "writer": '<style:style style:name="B" style:family="text"><style:text-properties fo:font-weight="bold" '
              'style:font-weight-asian="bold" style:font-weight-complex="bold"/></style:style>',
    "calc": "",
}

# Fonts every start document uses (Debian: fonts-liberation), so that text renders the same everywhere.
FONT_FACES = (
    "<office:font-face-decls>"
    '<style:font-face style:name="Liberation Serif" svg:font-family="&apos;Liberation Serif&apos;" '
    'style:font-family-generic="roman" style:font-pitch="variable"/>'
    '<style:font-face style:name="Liberation Sans" svg:font-family="&apos;Liberation Sans&apos;" '
    'style:font-family-generic="swiss" style:font-pitch="variable"/>'
    "</office:font-face-decls>"
)
STYLES = {
    "writer": '<style:default-style style:family="paragraph"><style:paragraph-properties fo:margin-bottom="0.1in"/>'
              '<style:text-properties style:font-name="Liberation Serif" fo:font-size="12pt" fo:language="en" '
              'fo:country="US"/></style:default-style>'
              '<style:style style:name="Standard" style:family="paragraph" style:class="text"/>',
    "calc": '<style:default-style style:family="table-cell"><style:text-properties style:font-name="Liberation Sans" '
            'fo:font-size="10pt" fo:language="en" fo:country="US"/></style:default-style>'
            '<style:style style:name="Default" style:family="table-cell"/>',
}

_DATE = (2024, 1, 1, 0, 0, 0)


def styles_xml(app: str) -> str:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-styles {NS}>{FONT_FACES}'
            f"<office:styles>{STYLES[app]}</office:styles></office:document-styles>\n")


def extension(app: str) -> str:
    return APPS[app][2]


def content_xml(app: str, body: str) -> str:
    _, element, _ = APPS[app]
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-content {NS}>'
        f"{FONT_FACES}<office:automatic-styles>{AUTO_STYLES[app]}</office:automatic-styles>"
        f"<office:body><office:{element}>{body.strip()}</office:{element}></office:body>"
        "</office:document-content>\n"
    )


def build(app: str, body: str) -> bytes:
    """The bytes of a .odt (``app="writer"``) or .ods (``app="calc"``) whose body is ``body``."""
    if app not in APPS:
        raise ValueError(f"unknown app {app!r}; choose writer or calc")
    mime = APPS[app][0]
    manifest = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" manifest:version="1.3">'
        f'<manifest:file-entry manifest:full-path="/" manifest:media-type="{mime}"/>'
        '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
        '<manifest:file-entry manifest:full-path="styles.xml" manifest:media-type="text/xml"/>'
        "</manifest:manifest>\n"
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        def add(name: str, data: str, method: int) -> None:
            info = zipfile.ZipInfo(name, _DATE)
            info.compress_type = method
            info.external_attr = 0o644 << 16
            z.writestr(info, data.encode())

        add("mimetype", mime, zipfile.ZIP_STORED)  # first and uncompressed, as ODF requires
        add("META-INF/manifest.xml", manifest, zipfile.ZIP_DEFLATED)
        add("content.xml", content_xml(app, body), zipfile.ZIP_DEFLATED)
        add("styles.xml", styles_xml(app), zipfile.ZIP_DEFLATED)
    return buf.getvalue()
