"""A document's text out of its bytes, without I/O: plain text and Markdown as they are (UTF-8),
HTML through BeautifulSoup (what a reader sees: no scripts, styles or markup), PDF through pypdf
(each page's text). Whatever cannot be read is refused saying what was wrong and what to do.

BeautifulSoup and pypdf are imported by the first document that needs them, not with the router
(half a second of every router's start)."""

from __future__ import annotations

import io
import logging
from pathlib import PurePosixPath

from llmgw.proto.knowledge import FORMATS, MOST_BYTES

__all__ = ["BadDocument", "document_format", "document_text"]


class BadDocument(ValueError):
    """A document that cannot be taken: the message says why and what to do."""


def document_format(path: str, data: bytes) -> str:
    """How a document is read, by its name's ending (a PDF also by its first bytes); BadDocument
    where it is empty, too large or of no format llmgw reads."""
    if not data:
        raise BadDocument(f"{path} is empty: there is nothing to answer from")
    if len(data) > MOST_BYTES:
        raise BadDocument(
            f"{path} is {len(data) / 2**20:.1f} MiB, more than the {MOST_BYTES // 2**20} MiB a document may be: "
            "split it into smaller files"
        )
    suffix = PurePosixPath(path).suffix.lower()
    fmt = FORMATS.get(suffix)
    if fmt is None:
        known = ", ".join(sorted(FORMATS))
        raise BadDocument(f"{path}: llmgw reads {known} documents, not '{suffix or 'no ending'}': convert it to one")
    if fmt == "pdf" and not data.startswith(b"%PDF-"):
        raise BadDocument(f"{path} ends with .pdf but is not a PDF (it does not start with %PDF-)")
    return fmt


def document_text(path: str, data: bytes, fmt: str) -> str:
    """The text of a document of format `fmt`; BadDocument where there is none to read."""
    if fmt == "pdf":
        text = _pdf_text(path, data)
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise BadDocument(f"{path} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
        if fmt == "html":
            from bs4 import BeautifulSoup

            soup = BeautifulSoup(text, "html.parser")
            for hidden in soup(["script", "style", "noscript", "template", "head"]):
                hidden.decompose()
            text = soup.get_text("\n")
    text = "\n".join(line.strip() for line in text.replace("\r\n", "\n").split("\n"))
    if not text.strip():
        hint = " (a scanned PDF? run OCR on it first)" if fmt == "pdf" else ""
        raise BadDocument(f"{path} has no text to answer from{hint}")
    return text


def _pdf_text(path: str, data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError, PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about odd files are ours to word
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise BadDocument(f"{path} is an encrypted PDF: send it without a password")
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except BadDocument:
        raise
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise BadDocument(f"{path} is a PDF that cannot be read ({type(exc).__name__}: {str(exc)[:160]})") from None
