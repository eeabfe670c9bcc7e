"""The agent keeps its best memory bandwidth in the data directory: started again (an upgrade, a
crash), it reports that figure at once and measures again only when the hour since its last
measurement is up, not at every start while its engines serve."""

import asyncio
import time

import pytest
import structlog

from llmgw.agent import node as node_module
from llmgw.agent.config import AgentConfig
from llmgw.agent.node import NodeFacts, this_machine
from llmgw.bus import find_llamacpp
from llmgw.membw import Bandwidth, KeptBandwidth, load_bandwidth, save_bandwidth

BEST = Bandwidth(31.0, 12.0, 2, 1 << 30)


def _kept(measured_ago: float, best_ago: float | None = None, machine: str = "") -> KeptBandwidth:
    now = time.time()
    best_at = now - (measured_ago if best_ago is None else best_ago)
    return KeptBandwidth(best=BEST, best_at=best_at, measured_at=now - measured_ago, machine=machine or this_machine())


class _Ctx:
    log = structlog.get_logger()


@pytest.fixture
def measured(monkeypatch):
    """What `measure` was asked for: each call reads 20 GB/s, 9 on one core (no real buffer)."""
    calls: list[float] = []

    def measure():
        calls.append(time.time())
        return Bandwidth(20.0, 9.0, 2, 1 << 30)

    monkeypatch.setattr(node_module, "measure", measure)
    return calls


def _facts(tmp_path, every_s: float = 3600) -> NodeFacts:
    config = AgentConfig(node="a", data_dir=str(tmp_path), membw_delay_max_s=0, membw_every_s=every_s)
    facts = NodeFacts(config, find_llamacpp(), tmp_path / "cache", set)
    facts._ctx = _Ctx()
    return facts


async def _run_a_while(facts: NodeFacts, seconds: float = 0.3) -> None:
    task = asyncio.create_task(facts._measure_bandwidth())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_first_start_measures_and_keeps_the_figure(tmp_path, measured):
    facts = _facts(tmp_path)
    await _run_a_while(facts)
    assert len(measured) == 1 and facts.bandwidth == Bandwidth(20.0, 9.0, 2, 1 << 30)
    kept = load_bandwidth(tmp_path, this_machine())
    assert kept is not None and kept.best == facts.bandwidth and kept.measured_at == pytest.approx(measured[0], abs=1)


async def test_a_start_within_the_hour_reports_the_kept_figure_and_measures_nothing(tmp_path, measured):
    save_bandwidth(tmp_path, _kept(measured_ago=60))
    facts = _facts(tmp_path)
    await _run_a_while(facts)
    assert measured == [] and facts.bandwidth == BEST


async def test_a_start_after_the_hour_measures_and_keeps_the_better_of_the_two(tmp_path, measured):
    save_bandwidth(tmp_path, _kept(measured_ago=7200))
    facts = _facts(tmp_path)
    await _run_a_while(facts)
    assert len(measured) == 1 and facts.bandwidth == BEST  # 20 GB/s read while busy: the 31 stays
    kept = load_bandwidth(tmp_path, this_machine())
    assert kept is not None and kept.best == BEST and kept.measured_at > time.time() - 60


@pytest.mark.parametrize(
    "kept",
    [
        pytest.param(lambda: _kept(60, machine="another host, 64 CPUs, MemTotal: 1 kB"), id="another-machine"),
        pytest.param(lambda: _kept(60, best_ago=8 * 86400), id="a-best-older-than-a-week"),
    ],
)
async def test_a_figure_of_another_machine_or_too_old_is_measured_again(tmp_path, measured, kept):
    save_bandwidth(tmp_path, kept())
    facts = _facts(tmp_path)
    await _run_a_while(facts)
    assert len(measured) == 1 and facts.bandwidth == Bandwidth(20.0, 9.0, 2, 1 << 30)


async def test_a_data_directory_that_refuses_the_file_stops_no_measuring(tmp_path, measured, monkeypatch):
    def refuse(home, kept):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(node_module, "save_bandwidth", refuse)
    facts = _facts(tmp_path, every_s=0.05)
    await _run_a_while(facts, 0.5)
    assert len(measured) >= 2  # measured again after the first save failed


async def test_a_damaged_file_counts_as_none(tmp_path, measured):
    (tmp_path / "bandwidth.json").write_text("{not json")
    facts = _facts(tmp_path)
    await _run_a_while(facts)
    assert len(measured) == 1 and load_bandwidth(tmp_path, this_machine()).best == facts.bandwidth
