"""A service's data directory's disk on its admin port (`_disk.py`), on a real small filesystem
(a 16 MB tmpfs mounted for the test) and on the machine's own disk."""

import contextlib
import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llmgw.bus._disk import DiskCollector, disk_note


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB filesystem of its own (tmpfs), unmounted after."""
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_nearly_full_disk_is_said_with_what_is_left(small_disk):
    data = small_disk / "llmgw"  # not made yet: its nearest parent's disk is the one
    note = disk_note(data)
    assert note.startswith(f"disk nearly full: {data} has 16 MB free of 16 MB")
    with contextlib.suppress(OSError), (small_disk / "filler").open("wb", buffering=0) as f:
        while True:
            f.write(b"x" * (1 << 20))
    assert f"{data} has 0 MB free of 16 MB (0.0%)" in disk_note(data)
    registry = CollectorRegistry()
    registry.register(DiskCollector(data))
    text = generate_latest(registry).decode()
    assert f'llmgw_disk_size_bytes{{path="{data}"}} 1.6777216e+07' in text
    assert f'llmgw_disk_free_bytes{{path="{data}"}} 0.0' in text


def test_a_disk_with_room_says_nothing(tmp_path):
    assert shutil.disk_usage(tmp_path).free > 2 * 2**30  # this machine's own disk has room
    assert disk_note(tmp_path) == ""
