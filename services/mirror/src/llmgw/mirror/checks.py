"""What a file's first bytes say, without I/O: a pickle in disguise, a safetensors header that
does not hold together, and the git blob header a small file's published sha1 covers."""

from __future__ import annotations

import msgspec

__all__ = ["blob_header", "pickle_inside", "safetensors_error", "safetensors_header_size"]

_MAX_HEADER = 100 * 1024 * 1024
"""safetensors itself refuses headers over 100 MB."""


def blob_header(size: int) -> bytes:
    """What git puts before a file's bytes when it names them by sha1 (the Hub's `blobId`)."""
    return b"blob %d\0" % size


def pickle_inside(head: bytes) -> str:
    """What pickle `head` (a file's first bytes) shows, or empty: a pickle stream, or a zip archive
    (PyTorch's format) holding one."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return f"a Python pickle (protocol {head[1]})"
    if head.startswith(b"PK\x03\x04") and b".pkl" in head:
        return "a zip archive holding a Python pickle (PyTorch's save format)"
    return ""


def safetensors_header_size(first8: bytes) -> int:
    """The length of the JSON header a safetensors file announces in its first 8 bytes."""
    return int.from_bytes(first8[:8], "little") if len(first8) >= 8 else -1


def safetensors_error(first8: bytes, header: bytes, size: int) -> str:
    """Why a file of `size` bytes is not safetensors (its first 8 bytes, then the header they
    announce), or empty when every tensor lies inside the file."""
    length = safetensors_header_size(first8)
    if length < 2 or length > _MAX_HEADER or 8 + length > size:
        return f"not safetensors: its first 8 bytes announce a {length}-byte header in a {size}-byte file"
    try:
        table = msgspec.json.decode(header)
    except msgspec.DecodeError as exc:
        return f"not safetensors: its header is not JSON ({exc})"
    if not isinstance(table, dict):
        return "not safetensors: its header is not a JSON object"
    data = size - 8 - length
    for name, tensor in table.items():
        if name == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data
            or not isinstance(tensor.get("dtype"), str)
            or not isinstance(tensor.get("shape"), list)
        ):
            return f"not safetensors: tensor {name!r} does not lie inside the file's {data} bytes of data"
    return ""
