"""The agent's pure parts: cards and ports a replica gets, the engines' command lines, which cached
weights may go, and the engine's key hidden."""

import json
from pathlib import Path

import pytest

from llmgw.agent.core import (
    EngineSetup,
    cards_for,
    collect,
    delete,
    launch,
    parse_ports,
    pick_port,
    redact,
    worker_launch,
)
from llmgw.proto import FilePlace, GpuInfo, Model, Profile

MODEL = Model(name="m", source="o/r/m.gguf", context=2048)


def card(i, cls="h100-80g", foreign=0, peers=(), cc="9.0"):
    return GpuInfo(
        index=i,
        uuid=f"GPU-{i}",
        name="NVIDIA H100",
        cls=cls,
        memory_total_mb=81559,
        memory_foreign_mb=foreign,
        nvlink_peers=list(peers),
        compute_capability=cc,
    )


def pick_cards(profile, gpus, taken):
    """The cards the agent gives a replica the scheduler chose none for (modelplan.choose_cards)."""
    return cards_for(profile, [], gpus, taken)


def setup(binary="llama-server", weights="/c/m.gguf", port=9000, model=MODEL, profile=None, key="K", cpus=8, **more):
    return EngineSetup(
        binary=binary,
        weights=Path(weights),
        port=port,
        model=model,
        profile=profile or Profile(),
        api_key=key,
        node_cpus=cpus,
        **more,
    )


def test_of_the_classes_with_enough_free_cards_the_fastest_is_picked():
    gpus = [card(0, "l4-24g"), card(1, "l4-24g"), card(2, "h100-80g"), card(3, "a100-40g"), card(4, "a100-40g")]
    assert [g.uuid for g in pick_cards(Profile(gpus=1), gpus, set())] == ["GPU-2"]
    assert [g.uuid for g in pick_cards(Profile(gpus=2), gpus, set())] == ["GPU-3", "GPU-4"]
    assert [g.uuid for g in pick_cards(Profile(gpus=1), gpus, {"GPU-2"})] == ["GPU-3"]


def test_cards_below_the_profiles_compute_capability_are_not_picked():
    got = pick_cards(Profile(gpus=1, min_compute="8.9"), [card(0, "a100-80g", cc="8.0"), card(1, cc="9.0")], set())
    assert [g.uuid for g in got] == ["GPU-1"]
    with pytest.raises(ValueError, match="needs 1 free cards"):
        pick_cards(Profile(gpus=1, min_compute="10.0"), [card(0)], set())


def test_a_cpu_replica_is_explicit_about_context_slots_layers_and_threads():
    how = launch(setup(profile=Profile(slots=3, args=["--flash-attn", "on"]), key="KEY", cpus=4))
    pairs = dict(zip(how.argv[1::2], how.argv[2::2], strict=False))
    assert pairs["-c"] == "2048" and pairs["-np"] == "3" and pairs["-ngl"] == "0"
    assert pairs["--port"] == "9000" and pairs["--threads"] == "2"
    assert how.env["LLAMA_API_KEY"] == "KEY" and "KEY" not in how.argv  # a command line is anyone's to read
    assert how.argv[-2:] == ["--flash-attn", "on"] and "CUDA_VISIBLE_DEVICES" not in how.env


def test_a_llama_server_on_two_cards_puts_every_layer_there_split_by_memory():
    how = launch(setup(profile=Profile(name="gpu", gpus=2, env={"OMP_PROC_BIND": "close"}), cards=[card(0), card(3)]))
    pairs = dict(zip(how.argv[1::2], how.argv[2::2], strict=False))
    assert pairs["-ngl"] == "999" and pairs["--tensor-split"] == "81559,81559" and pairs["--split-mode"] == "layer"
    assert how.env == {"OMP_PROC_BIND": "close", "CUDA_VISIBLE_DEVICES": "GPU-0,GPU-3", "LLAMA_API_KEY": "K"}


def test_a_card_replica_with_experts_on_the_cpu_keeps_the_first_layers_experts_in_host_memory():
    profile = Profile(name="gpu", gpus=1, cpu_moe_layers=9, cpu_cores=6)
    how = launch(setup(profile=profile, cards=[card(0)], cpus=16))
    pairs = dict(zip(how.argv[1::2], how.argv[2::2], strict=False))
    assert pairs["-ngl"] == "999" and pairs["--n-cpu-moe"] == "9" and pairs["--threads"] == "6"
    assert "--n-cpu-moe" not in launch(setup(profile=Profile(name="gpu", gpus=1), cards=[card(0)])).argv
    assert "--n-cpu-moe" not in launch(setup(profile=Profile(cpu_moe_layers=9))).argv  # on the CPU: all there


def test_across_nodes_a_cpu_engine_keeps_its_share_of_the_layers_and_sends_the_rest_to_its_workers():
    how = launch(setup(profile=Profile(nodes=3), host="10.0.0.5", rpc=["10.0.0.6:20000", "10.0.0.7:20000"], layers=32))
    pairs = dict(zip(how.argv[1::2], how.argv[2::2], strict=False))
    assert pairs["--host"] == "10.0.0.5" and pairs["--rpc"] == "10.0.0.6:20000,10.0.0.7:20000"
    assert pairs["-ngl"] == "22"  # 10 of 32 layers stay here, 22 go to the two workers
    on_cards = launch(
        setup(profile=Profile(gpus=2, nodes=2), cards=[card(0), card(1)], rpc=["10.0.0.6:20000"], layers=32)
    )
    assert "--tensor-split" not in on_cards.argv  # split over every card, local and remote, by free memory
    assert on_cards.argv[on_cards.argv.index("-ngl") + 1] == "999"


def test_a_worker_serves_its_cards_or_its_cpu_threads_on_the_nodes_address():
    how = worker_launch("ggml-rpc-server", "10.0.0.6", 20000, Profile(cpu_cores=6), 16, [])
    assert how.argv == ["ggml-rpc-server", "--host", "10.0.0.6", "--port", "20000", "--threads", "6"]
    assert "CUDA_VISIBLE_DEVICES" not in how.env
    cards = worker_launch("ggml-rpc-server", "10.0.0.6", 20000, Profile(gpus=2), 16, [card(2), card(3)])
    assert cards.env["CUDA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"


def test_vllm_gets_tensor_parallel_a_pool_the_context_and_portable_kv_events():
    model = Model(name="big", source="o/r/config.json", context=32768)
    profile = Profile(name="gpu", engine="vllm", gpus=4, tensor_parallel=2, slots=64)
    cards = [card(i) for i in range(4)]
    how = launch(
        setup("vllm", "/c/o/r/config.json", model=model, profile=profile, cpus=64, cards=cards, kv_events_port=9001)
    )
    assert how.argv[:3] == ["vllm", "serve", "/c/o/r"]
    pairs = {flag: how.argv[i + 1] for i, flag in enumerate(how.argv[:-1]) if flag.startswith("--")}
    assert "--enable-prefix-caching" in how.argv
    assert pairs["--tensor-parallel-size"] == "2" and pairs["--pipeline-parallel-size"] == "2"
    assert pairs["--max-model-len"] == "32768" and pairs["--gpu-memory-utilization"] == "0.9"
    assert pairs["--max-num-seqs"] == "64" and pairs["--served-model-name"] == "big"
    assert pairs["--prefix-caching-hash-algo"] == "sha256_cbor"
    assert json.loads(pairs["--kv-events-config"])["endpoint"] == "tcp://127.0.0.1:9001"
    assert how.env["PYTHONHASHSEED"] == "0" and how.env["CUDA_VISIBLE_DEVICES"] == "GPU-0,GPU-1,GPU-2,GPU-3"
    assert how.env["VLLM_API_KEY"] == "K" and "K" not in how.argv


def test_an_embedding_model_runs_vllm_as_a_pooling_model_without_kv_events():
    model = Model(name="e5", source="o/r/config.json", context=512, kind="embedding")
    how = launch(
        setup("vllm", "/c/o/r/config.json", model=model, profile=Profile(name="gpu", engine="vllm", gpus=1),
              cpus=8, cards=[card(0)], kv_events_port=9001)
    )  # fmt: skip
    assert how.argv[-4:] == ["--runner", "pooling", "--convert", "embed"]
    assert "--enable-prefix-caching" not in how.argv and "PYTHONHASHSEED" not in how.env


def test_an_embedding_model_gets_its_whole_context_in_each_llama_server_slot():
    model = Model(name="minilm", source="o/r/m.gguf", context=512, kind="embedding")
    how = launch(setup("llama-server", "/c/o/r/m.gguf", model=model, profile=Profile(slots=4), cpus=8))
    pairs = {flag: how.argv[i + 1] for i, flag in enumerate(how.argv[:-1]) if flag.startswith("-")}
    assert pairs["-c"] == "2048" and pairs["-np"] == "4" and "--embedding" in how.argv


def test_cards_are_free_ones_of_the_class_and_linked_ones_first():
    gpus = [card(0, peers=[]), card(1, peers=["GPU-2"]), card(2, peers=["GPU-1"]), card(3, foreign=5000)]
    assert [g.uuid for g in pick_cards(Profile(gpus=2), gpus, set())] == ["GPU-1", "GPU-2"]
    assert [g.uuid for g in pick_cards(Profile(gpus=1), gpus, {"GPU-1", "GPU-2"})] == ["GPU-0"]
    assert pick_cards(Profile(), gpus, set()) == []


@pytest.mark.parametrize(
    ("profile", "taken", "message"),
    [
        (
            Profile(name="gpu", gpus=2, gpu_class="l40s-48g"),
            set(),
            "needs 2 free cards of class l40s-48g; this node has none free of 2",
        ),
        (Profile(name="gpu", gpus=2), {"GPU-0"}, "needs 2 free cards of one class; this node has 1 h100-80g free of 2"),
    ],
)
def test_a_profile_asking_for_cards_the_node_lacks_is_refused_saying_what_it_has(profile, taken, message):
    with pytest.raises(ValueError, match=message):
        pick_cards(profile, [card(0), card(1)], taken)


def test_ports_come_from_the_range_never_twice_and_an_exhausted_range_says_so():
    ports = parse_ports("20000-20002")
    assert pick_port(ports, {20000}, lambda p: p != 20001) == 20002
    with pytest.raises(ValueError, match="no free port in 20000-20002 \\(2 held by replicas here\\)"):
        pick_port(ports, {20000, 20002}, lambda p: p != 20001)
    for bad in ("lots", "80-90", "30000-20000"):
        with pytest.raises(ValueError):
            parse_ports(bad)


def test_the_cards_the_scheduler_chose_are_given_if_all_are_here_and_free_else_refused_saying_what_is_free():
    gpus = [card(0), card(1), card(2)]
    assert [g.uuid for g in cards_for(Profile(gpus=2), ["GPU-2", "GPU-0"], gpus, set())] == ["GPU-0", "GPU-2"]
    with pytest.raises(
        ValueError, match="the cards GPU-1, GPU-7 are not all here and free \\(free here: GPU-0, GPU-2\\)"
    ):
        cards_for(Profile(gpus=2), ["GPU-1", "GPU-7"], gpus, {"GPU-1"})


def test_a_card_crowded_by_foreign_processes_is_not_given_out():
    gpus = [card(0, foreign=1024), card(1, foreign=1023)]
    assert [g.uuid for g in pick_cards(Profile(gpus=1), gpus, set())] == ["GPU-1"]


CACHE = {Path("/c/aa"): ["o/r/a.gguf"], Path("/c/bb"): ["o/r/b.gguf", "o/s/b.gguf"], Path("/c/cc"): ["o/r/c.gguf"]}


def test_a_deletion_keeps_a_file_a_replica_runs_on_or_another_source_still_is_and_says_why():
    # r1 runs on other weights with o/r/c.gguf as its adapter: that keeps it as much as weights would
    plan = delete(CACHE, ["o/r/a.gguf", "o/r/b.gguf", "o/r/c.gguf"], {"r1": ["o/r/x.gguf", "o/r/c.gguf"]}, "a")
    assert plan.folders == [Path("/c/aa")] and plan.answer.deleted == ["o/r/a.gguf"]
    assert plan.answer.kept == [
        FilePlace(source="o/r/b.gguf", where="a", why="the same file is also o/s/b.gguf"),
        FilePlace(source="o/r/c.gguf", where="a", why="replica r1 runs on it"),
    ]
    both = delete(CACHE, ["o/r/b.gguf", "o/s/b.gguf"], {}, "a")
    assert both.folders == [Path("/c/bb")] and both.answer.deleted == ["o/r/b.gguf", "o/s/b.gguf"]


def test_collecting_deletes_what_no_model_uses_and_no_replica_runs_on():
    plan = collect({**CACHE, Path("/c/dd"): []}, ["o/s/b.gguf"], {"r1": ["o/r/c.gguf"]}, "a")
    assert plan.folders == [Path("/c/aa"), Path("/c/dd")]
    assert plan.answer.deleted == ["o/r/a.gguf", "dd"] and plan.answer.where == "a"


def test_the_engines_key_is_hidden_wherever_it_appears():
    line = "non-default args: {'api_key': ['s3cret'], 'port': 9000} s3cret"
    assert redact(line, ["s3cret"]) == "non-default args: {'api_key': ['***'], 'port': 9000} ***"
    assert redact("nothing to hide", [""]) == "nothing to hide"
