"""GPU discovery on a fake NVML (a stand-in for pynvml, named so), and the host's facts."""

from llmgw.agent.discovery import EngineProbe, cpu_flags, discover_cards, filesystems, os_release
from services.agent.tests.fake_nvml import FakeCard, FakeNvml


def test_one_card_with_its_class_capability_and_foreign_memory():
    nvml = FakeNvml([FakeCard(used_mb=3000, processes=[(100, 1000), (4242, 2000)])])
    cards = discover_cards(nvml, own_pids={4242})
    [gpu] = cards.gpus
    assert (gpu.uuid, gpu.cls, gpu.compute_capability, gpu.memory_total_mb) == ("GPU-0000", "h100-80g", "9.0", 81559)
    assert gpu.memory_used_mb == 3000 and gpu.memory_foreign_mb == 1000  # the engine 4242 is ours
    assert cards.driver == "570.124.06" and cards.problems == [] and nvml.shutdowns == 1


def test_eight_cards_linked_all_to_all_report_their_nvlink_peers():
    nvml = FakeNvml([FakeCard(nvlink_to=[j for j in range(8) if j != i]) for i in range(8)])
    cards = discover_cards(nvml)
    assert [g.index for g in cards.gpus] == list(range(8))
    assert cards.gpus[3].nvlink_peers == [f"GPU-{j:04d}" for j in range(8) if j != 3]


def test_a_card_carved_into_mig_reports_its_instances_not_the_card():
    mig = FakeCard(
        name="NVIDIA A100-SXM4-80GB",
        total_mb=81920,
        capability=(8, 0),
        mig=[("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40192), ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40192)],
    )
    cards = discover_cards(FakeNvml([mig, FakeCard(name="NVIDIA A100-SXM4-80GB", total_mb=81920, capability=(8, 0))]))
    assert [(g.uuid, g.cls, g.mig_parent) for g in cards.gpus] == [
        ("MIG-0-0", "a100-mig-3g.40gb", "GPU-0000"),
        ("MIG-0-1", "a100-mig-3g.40gb", "GPU-0000"),
        ("GPU-0001", "a100-80g", ""),
    ]


def test_no_driver_is_a_node_without_gpus_said_once():
    cards = discover_cards(FakeNvml([], driver=None))
    assert cards.gpus == [] and cards.problems == ["no NVIDIA driver (Driver Not Loaded): a node without GPUs"]
    assert discover_cards(None).problems == ["nvidia-ml-py is not installed: a node without GPUs"]


def test_a_driver_error_on_one_card_leaves_it_out_and_the_others_are_reported():
    cards = discover_cards(FakeNvml([FakeCard(), FakeCard(broken=True), FakeCard(name="NVIDIA L40S", total_mb=46068)]))
    assert [g.cls for g in cards.gpus] == ["h100-80g", "l40s-48g"]
    assert cards.problems == ["card 1: NVML failed (Unknown Error); left out"]


def test_cpu_flags_os_and_filesystems_are_read(tmp_path):
    assert cpu_flags("processor : 0\nflags : fpu sse avx avx2 fma f16c avx512f amx_tile\n") == [
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "amx_tile",
    ]
    assert cpu_flags("Features : fp asimd evtstrm sve\n") == ["asimd", "sve"]
    release = 'NAME="Ubuntu"\nID=ubuntu\nVERSION_ID="22.04"\nVERSION_CODENAME=jammy\n'
    assert os_release(release) == "ubuntu 22.04 (jammy)"
    [fs] = filesystems([tmp_path, tmp_path / "."])
    assert fs.path == str(tmp_path) and 0 < fs.free_mb <= fs.total_mb


def test_engine_versions_are_probed_and_probed_again_when_the_binary_changes(tmp_path):
    fake = tmp_path / "fake-engine"
    fake.write_text("#!/bin/sh\necho 'version: 100 (abc1234)'\n")
    fake.chmod(0o755)
    probe = EngineProbe({"llamacpp": str(fake), "vllm": str(tmp_path / "absent")})
    assert probe.versions() == {"llamacpp": "100 (abc1234)"}
    fake.write_text("#!/bin/sh\necho 'version: 101 (def5678)'\n")
    import os

    os.utime(fake, (1, 1))
    assert probe.versions() == {"llamacpp": "101 (def5678)"}
