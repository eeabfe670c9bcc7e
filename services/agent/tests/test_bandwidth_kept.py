"""The agent keeps its best memory bandwidth in the data directory: started again (an upgrade, a
crash), it reports that figure at once and measures again only when the hour since its last
measurement is up, not at every start while its engines serve."""

import asyncio
import time

import pytest
import structlog

from llmgw.agent import node as node_module
from llmgw.agent.config import AgentConfig
from llmgw.agent.node import NodeFacts
from llmgw.bus import find_llamacpp
from llmgw.membw import Bandwidth, KeptBandwidth, load_bandwidth, save_bandwidth


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


def _facts(tmp_path) -> NodeFacts:
    config = AgentConfig(node="a", data_dir=str(tmp_path), membw_delay_max_s=0, membw_every_s=3600)
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
    kept = load_bandwidth(tmp_path)
    assert kept is not None and kept.best == facts.bandwidth and kept.measured_at == pytest.approx(measured[0], abs=1)


async def test_a_start_within_the_hour_reports_the_kept_figure_and_measures_nothing(tmp_path, measured):
    best = Bandwidth(31.0, 12.0, 2, 1 << 30)
    save_bandwidth(tmp_path, KeptBandwidth(best=best, measured_at=time.time() - 60))
    facts = _facts(tmp_path)
    await _run_a_while(facts)
    assert measured == [] and facts.bandwidth == best


async def test_a_start_after_the_hour_measures_and_keeps_the_better_of_the_two(tmp_path, measured):
    best = Bandwidth(31.0, 12.0, 2, 1 << 30)
    save_bandwidth(tmp_path, KeptBandwidth(best=best, measured_at=time.time() - 7200))
    facts = _facts(tmp_path)
    await _run_a_while(facts)
    assert len(measured) == 1 and facts.bandwidth == best  # 20 GB/s read while busy: the 31 stays
    kept = load_bandwidth(tmp_path)
    assert kept is not None and kept.best == best and kept.measured_at > time.time() - 60


async def test_a_damaged_file_counts_as_none(tmp_path, measured):
    (tmp_path / "bandwidth.json").write_text("{not json")
    facts = _facts(tmp_path)
    await _run_a_while(facts)
    assert len(measured) == 1 and load_bandwidth(tmp_path).best == facts.bandwidth
