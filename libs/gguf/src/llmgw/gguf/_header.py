"""Facts from a GGUF header: read from a local file, or from the first bytes of a remote one.

The `gguf` package's reader maps a whole local file; a header on a server is read here with
HTTP range requests instead, a growing window at a time, never the whole file. The format's
constants (value types, tensor types and their block sizes, file types, key names) are the
`gguf` package's.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import NamedTuple

import httpx
import msgspec

import gguf
from llmgw.gguf._sources import ByteSource, GGUFError, open_bytes

__all__ = [
    "MAX_ARRAY_DEPTH",
    "GGUFError",
    "Header",
    "bytes_per_weight",
    "read_header",
    "read_model",
    "read_tensors",
    "split_parts",
]

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
# Sanity bounds: a file past them is not a GGUF model, whatever its first four bytes say.
_MAX_COUNT = 1 << 24
_MAX_STRING = 1 << 28
MAX_ARRAY_DEPTH = 8
"""Arrays one inside another a header may hold (GGUF allows arrays of arrays; none nests this deep)."""
_SCALARS = {
    gguf.GGUFValueType.UINT8: "<B",
    gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f",
    gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}


class Header(msgspec.Struct, frozen=True, kw_only=True):
    """What llmgw needs to know of a GGUF model before it runs it."""

    where: str
    """The file or URL read (the first part of a split model)."""
    version: int
    architecture: str
    name: str = ""
    file_type: str = ""
    """Quantisation of the file as a whole ("Q4_K_M", "F16"); from general.file_type, else the
    tensor type holding the most bytes."""
    block_count: int = 0
    embedding_length: int = 0
    feed_forward_length: int = 0
    """Width of a layer's feed-forward (an expert's, for a model of experts)."""
    head_count: int = 0
    head_count_kv: int = 0
    key_length: int = 0
    """Per head; the explicit key, else embedding / heads."""
    value_length: int = 0
    sliding_window: int = 0
    context_length: int = 0
    """What the model was trained for."""
    vocab_size: int = 0
    expert_count: int = 0
    expert_used_count: int = 0
    expert_shared_count: int = 0
    embedding: bool = False
    """An embedding model (pooling type set, not none): served with --embedding, never chats."""
    chat_template: str = ""
    tensor_count: int = 0
    parameters: int = 0
    """Elements in every tensor."""
    tensor_bytes: int = 0
    """Bytes of every tensor, in all parts."""
    expert_bytes: int = 0
    """Of those, the routed experts' tensors (a token reads `expert_used_count` of them)."""
    first_expert_layer: int = 0
    """The first block (`blk.N.`) holding routed experts; the ones before it are dense."""
    type_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    """Tensor bytes by tensor type ("Q4_K": ...)."""
    split_count: int = 1
    """Parts of a split model (`-00001-of-00003.gguf`); 1 for one file."""
    header_bytes: int = 0
    """Where the tensor data starts in the first part."""

    @property
    def dense_bytes(self) -> int:
        """What every token reads: attention, embeddings, norms, shared experts, routing."""
        return self.tensor_bytes - self.expert_bytes

    @property
    def active_bytes(self) -> int:
        """What one token reads: the dense part and its share of the experts."""
        if not self.expert_count or not self.expert_used_count or self.expert_used_count >= self.expert_count:
            return self.tensor_bytes
        return self.dense_bytes + self.expert_bytes * self.expert_used_count // self.expert_count


class _Reader:
    """Reads the header front to back, knowing at every step what it is reading and where."""

    def __init__(self, src: ByteSource) -> None:
        self.src, self.pos = src, 0

    def take(self, n: int, what: str) -> bytes:
        data = self.src.read(self.pos, n)
        if len(data) < n:
            raise GGUFError(
                f"{self.src.where}: cut short at byte {self.pos + len(data)} while reading {what}; "
                "the file is truncated or still being written"
            )
        self.pos += n
        return data

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str) -> int:
        n = self.scalar("<Q", what)
        if n > _MAX_COUNT:
            raise GGUFError(f"{self.src.where}: {what} is {n} at byte {self.pos - 8}, not a plausible GGUF header")
        return n

    def string(self, what: str) -> str:
        n = self.scalar("<Q", f"the length of {what}")
        if n > _MAX_STRING:
            raise GGUFError(f"{self.src.where}: {what} claims {n} bytes at byte {self.pos - 8}; not a GGUF header")
        return self.take(n, what).decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, depth: int = 0):
        """A value of `vtype`; arrays give their length only (their items are skipped). Arrays of
        arrays are read `MAX_ARRAY_DEPTH` deep at most (`depth`: how deep this one is)."""
        if vtype == gguf.GGUFValueType.STRING:
            return self.string(what)
        if vtype == gguf.GGUFValueType.ARRAY:
            return self._array(what, depth)
        if vtype not in _SCALARS:
            raise self._undefined(what, vtype, self.pos - 4)
        return self.scalar(_SCALARS[vtype], what)

    def _array(self, what: str, depth: int) -> int:
        if depth >= MAX_ARRAY_DEPTH:
            raise GGUFError(
                f"{self.src.where}: {what} holds arrays nested deeper than {MAX_ARRAY_DEPTH} at byte {self.pos}; "
                "the header is damaged or not a GGUF model llmgw reads"
            )
        itype = self.scalar("<I", f"the item type of {what}")
        n = self.count(f"the length of {what}")
        if itype in _SCALARS:
            self.take(n * struct.calcsize(_SCALARS[itype]), what)
        elif itype in (gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY):
            for i in range(n):
                self.value(itype, f"item {i} of {what}", depth + 1)
        else:
            raise self._undefined(f"the items of {what}", itype, self.pos - 12)
        return n

    def _undefined(self, what: str, vtype: int, at: int) -> GGUFError:
        return GGUFError(f"{self.src.where}: {what} has value type {vtype} at byte {at}, which GGUF does not define")


def _tensor_type_name(type_id: int, name: str, where: str) -> tuple[str, int, int]:
    try:
        qtype = gguf.GGMLQuantizationType(type_id)
    except ValueError:
        raise GGUFError(
            f"{where}: tensor '{name}' has type {type_id}, which the gguf package "
            f"{getattr(gguf, '__version__', '')} does not know; a newer llmgw may read it"
        ) from None
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return qtype.name, block, size


def bytes_per_weight(type_name: str) -> float:
    """Bytes a weight of tensor type `type_name` ("Q4_K") takes: its block's bytes over its weights."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return size / block


def _file_type_name(value: int | None, type_bytes: dict[str, int]) -> str:
    if value is not None:
        try:
            return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    return max(type_bytes, key=type_bytes.get) if type_bytes else ""


class _Parsed(NamedTuple):
    meta: dict[str, object]
    tensors: int
    parameters: int
    tensor_bytes: int
    expert_bytes: int
    first_expert_layer: int
    header_bytes: int
    type_bytes: dict[str, int]
    dims: dict[str, tuple[int, ...]]
    """Each tensor's dimensions as stored (GGML's order: the row's length first)."""


def _parse(src: ByteSource) -> _Parsed:
    """The metadata and the tensors' sizes, read front to back."""
    r = _Reader(src)
    magic = r.take(4, "the magic number")
    if magic != _MAGIC:
        raise GGUFError(f"{src.where}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    version = r.scalar("<I", "the version")
    if version not in _VERSIONS:
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        if swapped in _VERSIONS:
            raise GGUFError(f"{src.where}: a big-endian GGUF (version {swapped}); llmgw reads little-endian files only")
        raise GGUFError(f"{src.where}: GGUF version {version}; llmgw reads versions {', '.join(map(str, _VERSIONS))}")
    n_tensors = r.count("the tensor count")
    n_kv = r.count("the metadata count")
    meta: dict[str, object] = {"general.version": version}
    for i in range(n_kv):
        key = r.string(f"the key of metadata entry {i}")
        vtype = r.scalar("<I", f"the type of '{key}'")
        meta[key] = r.value(vtype, f"'{key}'")
    parameters = tensor_bytes = expert_bytes = data_end = 0
    first_expert = -1
    type_bytes: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(n_tensors):
        name = r.string(f"the name of tensor {i}")
        n_dims = r.scalar("<I", f"the dimensions of tensor '{name}'")
        if n_dims > 8:
            raise GGUFError(
                f"{src.where}: tensor '{name}' claims {n_dims} dimensions at byte {r.pos - 4}; not a GGUF header"
            )
        dims = [r.scalar("<Q", f"the shape of tensor '{name}'") for _ in range(n_dims)]
        shapes[name] = tuple(dims)
        type_name, block, size = _tensor_type_name(r.scalar("<I", f"the type of tensor '{name}'"), name, src.where)
        offset = r.scalar("<Q", f"the offset of tensor '{name}'")
        elements = 1
        for d in dims:
            elements *= d
        nbytes = elements // block * size
        data_end = max(data_end, offset + nbytes)
        parameters += elements
        tensor_bytes += nbytes
        type_bytes[type_name] = type_bytes.get(type_name, 0) + nbytes
        if "_exps." in name:  # routed experts; shared ones are '_shexp'
            expert_bytes += nbytes
            block = _BLOCK.match(name)
            if block and (first_expert < 0 or int(block[1]) < first_expert):
                first_expert = int(block[1])
    alignment = int(meta.get("general.alignment", 32) or 32)
    header_bytes = -(-r.pos // alignment) * alignment
    size = src.size()
    if size is not None and size < header_bytes + data_end:
        raise GGUFError(
            f"{src.where}: cut short: its tensors end at byte {header_bytes + data_end} but it has "
            f"{size} bytes; the file is truncated or still being written"
        )
    first = max(first_expert, 0)
    return _Parsed(meta, n_tensors, parameters, tensor_bytes, expert_bytes, first, header_bytes, type_bytes, shapes)


def read_tensors(where: str | Path) -> tuple[dict[str, object], dict[str, tuple[int, ...]]]:
    """One GGUF file's metadata (arrays by their length) and each tensor's dimensions, GGML's
    order (for a LoRA adapter's check against its base: `llmgw.gguf.check_lora`)."""
    src = open_bytes(where, None)
    try:
        parsed = _parse(src)
    finally:
        src.close()
    return parsed.meta, parsed.dims


def read_header(where: str | Path, client: httpx.Client | None = None) -> Header:
    """The facts of one GGUF file (one part, for a split model: see `read_model`)."""
    src = open_bytes(where, client)
    try:
        parsed = _parse(src)
    finally:
        src.close()
    meta = parsed.meta
    arch = str(meta.get("general.architecture", ""))

    def num(key: str, default: int = 0) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return default  # an array (per-layer heads) or absent: the plain figure is unknown

    embd, heads = num("embedding_length"), num("attention.head_count")
    per_head = embd // heads if heads else 0
    pooling = meta.get(f"{arch}.pooling_type")
    return Header(
        where=src.where,
        version=int(meta["general.version"]),
        architecture=arch,
        name=str(meta.get("general.name", "")),
        file_type=_file_type_name(meta.get("general.file_type"), parsed.type_bytes),
        block_count=num("block_count"),
        embedding_length=embd,
        head_count=heads,
        feed_forward_length=num("expert_feed_forward_length") or num("feed_forward_length"),
        head_count_kv=num("attention.head_count_kv", heads),
        key_length=num("attention.key_length", per_head),
        value_length=num("attention.value_length", per_head),
        sliding_window=num("attention.sliding_window"),
        context_length=num("context_length"),
        vocab_size=int(meta.get("tokenizer.ggml.tokens", 0) or 0),
        expert_count=num("expert_count"),
        expert_used_count=num("expert_used_count"),
        expert_shared_count=num("expert_shared_count"),
        embedding=isinstance(pooling, int) and pooling not in (-1, 0),
        chat_template=str(meta.get("tokenizer.chat_template", "")),
        tensor_count=parsed.tensors,
        parameters=parsed.parameters,
        tensor_bytes=parsed.tensor_bytes,
        expert_bytes=parsed.expert_bytes,
        first_expert_layer=parsed.first_expert_layer,
        type_bytes=parsed.type_bytes,
        split_count=int(meta.get("split.count", 1) or 1),
        header_bytes=parsed.header_bytes,
    )


def split_parts(where: str) -> list[str]:
    """Every part's name of a split model (`x-00001-of-00003.gguf`), or `[where]` for one file."""
    m = _SPLIT.match(where)
    if not m:
        return [where]
    count = int(m["count"])
    return [f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def read_model(where: str | Path, client: httpx.Client | None = None) -> Header:
    """The facts of a model, all its parts read for a split one (tensor bytes added up)."""
    parts = split_parts(str(where))
    first = read_header(parts[0], client)
    if len(parts) == 1:
        return first
    rest = [read_header(part, client) for part in parts[1:]]
    types = dict(first.type_bytes)
    for h in rest:
        for k, v in h.type_bytes.items():
            types[k] = types.get(k, 0) + v
    every = [first, *rest]
    return msgspec.structs.replace(
        first,
        tensor_count=sum(h.tensor_count for h in every),
        parameters=sum(h.parameters for h in every),
        tensor_bytes=sum(h.tensor_bytes for h in every),
        expert_bytes=sum(h.expert_bytes for h in every),
        first_expert_layer=min((h.first_expert_layer for h in every if h.expert_bytes), default=0),
        type_bytes=types,
        file_type=first.file_type or _file_type_name(None, types),
        split_count=len(parts),
    )
