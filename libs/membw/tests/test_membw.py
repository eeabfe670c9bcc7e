"""The bandwidth kernel: an honest buffer, or no figure at all."""

from llmgw.membw import buffer_size, last_level_cache_bytes, measure
from llmgw.membw._kernel import Buffer


def test_the_buffer_is_four_times_the_cache_and_at_most_a_quarter_of_memory():
    assert buffer_size(64 << 20, 16 << 30) == 256 << 20
    assert buffer_size(128 << 20, 16 << 30) == 512 << 20


def test_with_too_little_memory_it_reports_nothing_rather_than_a_cache_figure():
    assert buffer_size(64 << 20, 512 << 20) is None


def test_the_cache_size_is_read_from_sysfs(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (3, "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32 << 20


def test_a_measurement_gives_one_core_at_most_all_cores():
    bw = measure(passes=2)
    assert bw is not None and 0 < bw.one_core_gbs <= bw.all_cores_gbs
    assert bw.buffer_bytes >= 4 * (last_level_cache_bytes() or 0)


def test_reading_with_more_threads_than_words_still_reads_every_word():
    assert Buffer(64).read_seconds(16) >= 0
