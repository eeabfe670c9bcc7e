"""A replica's measured memory: its processes' RSS, and NVML's per-process memory on cards
(read from FakeNvml: no GPU here)."""

import os
import subprocess

from llmgw.agent.usage import card_mb_by_pid, engine_memory_mb
from services.agent.tests.fake_nvml import FakeCard, FakeNvml


def test_card_memory_is_summed_per_process_over_the_cards_and_is_nothing_without_a_driver():
    nvml = FakeNvml([FakeCard(processes=[(10, 500), (11, 100)]), FakeCard(processes=[(10, 300)])])
    assert card_mb_by_pid(nvml) == {10: 800, 11: 100}
    assert nvml.inits == nvml.shutdowns == 1
    assert card_mb_by_pid(None) == {} and card_mb_by_pid(FakeNvml([], driver=None)) == {}
    assert card_mb_by_pid(FakeNvml([FakeCard(broken=True), FakeCard(processes=[(7, 5)])])) == {7: 5}


def test_an_engines_memory_is_its_process_trees_rss_plus_what_it_holds_on_cards_and_nothing_once_gone():
    mine = engine_memory_mb(os.getpid(), {})
    assert mine > 0 and engine_memory_mb(os.getpid(), {os.getpid(): 1000}) >= mine + 1000 - 16
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert engine_memory_mb(gone.pid, {gone.pid: 1000}) == 0
