"""GGUF arrays of arrays: read to a bounded depth; deeper or damaged ones refused saying what is wrong."""

import struct
import subprocess
import sys

import gguf
import pytest

from llmgw.gguf import GGUFError, read_header
from llmgw.gguf._header import MAX_ARRAY_DEPTH

ARRAY, UINT8, STRING = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT8, gguf.GGUFValueType.STRING


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def _nested(depth: int, items: int = 1, innermost: bytes = struct.pack("<IQ", UINT8, 2) + b"\x01\x02") -> bytes:
    """`depth` arrays one inside another (each of `items` items), the innermost of two uint8."""
    value = innermost
    for _ in range(depth - 1):
        value = struct.pack("<IQ", ARRAY, items) + value * items
    return value


def _file(path, value: bytes):
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    arch = _string("general.architecture") + struct.pack("<I", STRING) + _string("llama")
    data = head + arch + _string("nested.key") + struct.pack("<I", ARRAY) + value
    path.write_bytes(data + b"\0" * (-len(data) % 32))  # the tensor data (none) starts aligned
    return path


def test_arrays_of_arrays_are_read_to_the_bound(tmp_path):
    assert read_header(_file(tmp_path / "two.gguf", _nested(2, items=3))).architecture == "llama"
    assert read_header(_file(tmp_path / "most.gguf", _nested(MAX_ARRAY_DEPTH))).architecture == "llama"


@pytest.mark.parametrize("depth", [MAX_ARRAY_DEPTH + 1, 5000])
def test_arrays_nested_deeper_than_the_bound_are_refused_saying_where(tmp_path, depth):
    with pytest.raises(GGUFError, match=f"arrays nested deeper than {MAX_ARRAY_DEPTH} at byte \\d+") as refused:
        read_header(_file(tmp_path / "deep.gguf", _nested(depth)))
    assert "'nested.key'" in str(refused.value) and "not a GGUF model llmgw reads" in str(refused.value)


def test_an_array_of_an_undefined_type_is_refused_naming_the_type(tmp_path):
    with pytest.raises(GGUFError, match="value type 99 at byte \\d+, which GGUF does not define"):
        read_header(_file(tmp_path / "odd.gguf", _nested(3, innermost=struct.pack("<IQ", 99, 1) + b"\0" * 8)))


def test_llmgw_plan_on_deeply_nested_arrays_says_one_sentence_and_exits_2(tmp_path):
    deep = _file(tmp_path / "deep.gguf", _nested(100_000))
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.ctl", "plan", str(deep), "--node-bandwidth", "40,10"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("llmgw plan: ") and f"arrays nested deeper than {MAX_ARRAY_DEPTH}" in line
