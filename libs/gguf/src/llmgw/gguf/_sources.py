"""Where a GGUF header's bytes come from: a local file, or a remote one read with HTTP range
requests in a window that grows; and the error every bad header raises."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import httpx

__all__ = ["ByteSource", "GGUFError", "open_bytes"]


class GGUFError(ValueError):
    """A file that is not GGUF, is cut short, or is of a version this reader does not read.

    The message names the file and the byte where reading stopped.
    """


class ByteSource(Protocol):
    where: str

    def size(self) -> int | None:
        """The whole file's size, where known."""

    def read(self, offset: int, n: int) -> bytes:
        """`n` bytes at `offset`, or fewer at the end of the file."""


class _LocalBytes:
    def __init__(self, path: Path) -> None:
        self.where = str(path)
        try:
            self.file = open(path, "rb")  # closed by read_header
        except OSError as exc:
            raise GGUFError(f"{path}: {exc.strerror}") from None

    def read(self, offset: int, n: int) -> bytes:
        self.file.seek(offset)
        return self.file.read(n)

    def size(self) -> int | None:
        return os.fstat(self.file.fileno()).st_size

    def close(self) -> None:
        self.file.close()


class _RemoteBytes:
    """Range requests in a window that doubles, so a header of megabytes takes a handful."""

    def __init__(self, url: str, client: httpx.Client) -> None:
        self.where, self.client = url, client
        self.start, self.data, self.window, self.fetched = 0, b"", 1 << 16, 0
        self.total: int | None = None

    def size(self) -> int | None:
        return self.total

    def read(self, offset: int, n: int) -> bytes:
        end = offset + n
        if not (self.start <= offset and end <= self.start + len(self.data)):
            if self.total is not None and offset >= self.total:
                return b""
            want = max(n, self.window)
            self.window = min(self.window * 2, 1 << 24)
            r = self.client.get(self.where, headers={"range": f"bytes={offset}-{offset + want - 1}"})
            if r.status_code == 416:
                return b""
            if r.status_code != 206:
                raise GGUFError(
                    f"{self.where}: the server answered {r.status_code} to a range request; "
                    "it must serve byte ranges (206) for the header to be read without the whole file"
                )
            self.start, self.data = offset, r.content
            self.fetched += len(r.content)
            total = r.headers.get("content-range", "").rpartition("/")[2]
            self.total = int(total) if total.isdigit() else None
        return self.data[offset - self.start : end - self.start]

    def close(self) -> None:
        pass


def open_bytes(where: str | Path, client: httpx.Client | None) -> ByteSource:
    """The bytes of a local file, or of a remote one by range requests."""
    text = str(where)
    if text.startswith(("http://", "https://")):
        return _RemoteBytes(text, client or httpx.Client(timeout=30, follow_redirects=True))
    return _LocalBytes(Path(where))
