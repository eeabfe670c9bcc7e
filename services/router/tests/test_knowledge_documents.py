"""Documents read and cut: what each format gives, and every way a document is refused with
words that say what to do."""

from __future__ import annotations

import pytest

from llmgw.proto.knowledge import MOST_BYTES
from llmgw.router.knowledge.chunk import chunks, halves
from llmgw.router.knowledge.parse import BadDocument, document_format, document_text
from tests.documents import HANDBOOK, encrypted_pdf, pdf_with


def _read(path: str, data: bytes) -> str:
    return document_text(path, data, document_format(path, data))


def test_each_format_gives_the_text_a_reader_sees():
    html = _read("office/wifi.html", HANDBOOK["office/wifi.html"].encode())
    assert "heliotrope-42" in html and "Gaivota" in html
    assert "secret" not in html and "p{}" not in html and "<b>" not in html  # no script, style or markup
    assert "Falkenstein" in _read("travel/expenses.md", HANDBOOK["travel/expenses.md"].encode())
    assert _read("a.pdf", pdf_with("The boiler is serviced every October")).strip() == (
        "The boiler is serviced every October"
    )
    assert _read("bom.txt", "\ufeffhello".encode()) == "hello"


@pytest.mark.parametrize(
    ("path", "data", "says"),
    [
        ("empty.md", b"", "empty.md is empty: there is nothing to answer from"),
        ("huge.txt", b"x" * (MOST_BYTES + 1), "more than the 20 MiB a document may be: split it"),
        (
            "slides.pptx",
            b"PK\x03\x04",
            "llmgw reads .htm, .html, .markdown, .md, .pdf, .text, .txt documents, not '.pptx'",
        ),
        ("README", b"text", "not 'no ending'"),
        ("fake.pdf", b"hello", "fake.pdf ends with .pdf but is not a PDF"),
        ("cut.pdf", pdf_with("words")[:60], "cut.pdf is a PDF that cannot be read"),
        ("locked.pdf", encrypted_pdf(), "locked.pdf is an encrypted PDF: send it without a password"),
        ("blank.pdf", pdf_with(""), "blank.pdf has no text to answer from (a scanned PDF? run OCR on it first)"),
        ("latin1.txt", "café".encode("latin-1"), "latin1.txt is not UTF-8 text (byte 3): save it as UTF-8"),
        ("spaces.md", b"  \n\n \t", "spaces.md has no text to answer from"),
    ],
)
def test_a_document_that_cannot_be_read_is_refused_saying_why(path, data, says):
    with pytest.raises(BadDocument) as refused:
        _read(path, data)
    assert says in str(refused.value)


def test_chunks_hold_about_so_many_words_and_overlap():
    text = "\n\n".join(" ".join(f"p{p}w{w}." for w in range(30)) for p in range(10))  # 300 words
    cut = chunks(text, words=100, overlap=10)
    assert all(len(c.split()) <= 100 for c in cut) and len(cut) >= 3
    for before, after in zip(cut, cut[1:], strict=False):
        assert after.split()[:10] == before.split()[-10:]  # each starts with the last words of the one before
    assert " ".join(dict.fromkeys(w for c in cut for w in c.split())) == " ".join(text.split())  # nothing lost
    assert chunks("one paragraph", words=100, overlap=10) == ["one paragraph"]
    long_sentence = " ".join(["word"] * 250)
    assert [len(c.split()) for c in chunks(long_sentence, words=100, overlap=0)] == [100, 100, 50]
    assert halves("a b c d") == ["a b", "c d"] and halves("abcdef") == ["abc", "def"]
