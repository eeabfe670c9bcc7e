"""The mirror's rules, without I/O: where a source lives, and which bytes a Range asks for."""

from __future__ import annotations

from pathlib import PurePosixPath

__all__ = ["RangeNotSatisfiable", "parse_range", "source_path"]


class RangeNotSatisfiable(ValueError):
    """A Range header that names no bytes of the file (HTTP 416)."""


def source_path(source: str) -> PurePosixPath:
    """The relative path of `source` under the mirror's root; refuses anything that climbs out."""
    path = PurePosixPath(source)
    if path.is_absolute() or any(part.startswith(".") or not part for part in path.parts) or len(path.parts) < 3:
        raise ValueError(f"source '{source}' must be '<owner>/<repo>/<file>' with no part starting with '.'")
    return path


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte, inclusive, for a single-range `bytes=` header; None means the whole file."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        raise RangeNotSatisfiable(f"only one 'bytes=' range is served, not {header!r}")
    first_s, dash, last_s = spec.strip().partition("-")
    if not dash:
        raise RangeNotSatisfiable(f"range {header!r} has no '-'")
    try:
        if first_s == "":
            suffix = int(last_s)
            if suffix <= 0:
                raise RangeNotSatisfiable(f"range {header!r} asks for no bytes")
            return max(size - suffix, 0), size - 1
        first = int(first_s)
        last = int(last_s) if last_s else size - 1
    except ValueError:
        raise RangeNotSatisfiable(f"range {header!r} is not numbers") from None
    if first >= size or last < first:
        raise RangeNotSatisfiable(f"range {header!r} is outside the file's {size} bytes")
    return first, min(last, size - 1)
