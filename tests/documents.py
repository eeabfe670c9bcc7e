"""Documents for the knowledge tests, made here: a PDF with a line of text (written by hand, as
the PDF 1.4 reference lays one out: a page, its font, its content stream and the cross-reference
table), an encrypted one (pypdf), and a small handbook of facts a question finds."""

from __future__ import annotations

import io

from pypdf import PdfWriter

__all__ = ["HANDBOOK", "encrypted_pdf", "pdf_with"]

HANDBOOK = {
    "travel/expenses.md": "# Travel\n\nTrain tickets are refunded in full. Taxis are refunded up to 40 euros a day.\n\n"
    "Hotel rooms in Berlin are booked through the Falkenstein agency, never directly.",
    "office/wifi.html": "<html><head><title>x</title><style>p{}</style><script>var secret=1</script></head>"
    "<body><h1>Office network</h1><p>The guest wifi at the Lisbon office is called <b>Gaivota</b> and its "
    "password is heliotrope-42.</p></body></html>",
    "people/holidays.txt": "Every employee has 27 days of paid holiday a year.\n\nUnused days carry over until March.",
}
"""path -> text: each answers one question no other does."""


def pdf_with(text: str) -> bytes:
    """A one-page PDF whose page says `text` (Helvetica, ASCII without parentheses)."""
    content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = b"%PDF-1.4\n", []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (n, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


def encrypted_pdf() -> bytes:
    """A PDF that opens only with a password."""
    writer = PdfWriter()
    writer.add_blank_page(200, 200)
    writer.encrypt("s3cret")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
