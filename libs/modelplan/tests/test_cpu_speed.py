"""The CPU estimate's arithmetic per tensor type, and the fit kept only when it beats the defaults."""

import msgspec
import pytest

from llmgw.modelplan import (
    DEFAULT_CPU,
    FileFacts,
    Measured,
    NodeFacts,
    Shape,
    active_type_bytes,
    cpu_tokens_per_second,
    fit_cpu,
    holdout_error,
    judge_fit,
    options,
    worst_error,
)

MB = 10**6


def test_a_q4_model_is_slower_than_an_f16_model_reading_the_same_bytes():
    # Measured so on a 2-core EPYC: 97 MB of Q4_1 at 59 tok/s, 104 MB of F16 at 137 (one thread).
    q4 = cpu_tokens_per_second(100 * MB, 30, 16, 1, type_bytes={"Q4_1": 100 * MB})
    q8 = cpu_tokens_per_second(100 * MB, 30, 16, 1, type_bytes={"Q8_0": 100 * MB})
    f16 = cpu_tokens_per_second(100 * MB, 30, 16, 1, type_bytes={"F16": 100 * MB})
    assert q4 < q8 < f16
    assert f16 / q4 > 1.8


def test_the_threads_share_the_arithmetic_but_each_layer_makes_them_wait():
    one = cpu_tokens_per_second(100 * MB, 30, 16, 1, type_bytes={"Q4_1": 100 * MB}, layers=30)
    two = cpu_tokens_per_second(100 * MB, 30, 16, 2, type_bytes={"Q4_1": 100 * MB}, layers=30)
    shallow = cpu_tokens_per_second(100 * MB, 30, 16, 2, type_bytes={"Q4_1": 100 * MB}, layers=4)
    assert one < two < shallow


def test_types_not_measured_cost_what_the_blank_entry_says():
    k = msgspec.structs.replace(DEFAULT_CPU, compute_ns_per_byte={"": 1.0})
    assert cpu_tokens_per_second(MB, 30, 16, 1, k, {"Q5_K": MB}) == cpu_tokens_per_second(MB, 30, 16, 1, k)
    old = msgspec.structs.replace(DEFAULT_CPU, compute_ns_per_byte={})  # a calibration from before
    assert cpu_tokens_per_second(MB, 30, 16, 1, old, {"Q4_1": MB}) > cpu_tokens_per_second(MB, 30, 16, 1, k)


def test_a_plan_of_a_quantised_file_counts_its_types_arithmetic():
    def facts(types):
        shape = Shape(layers=30, embedding=576, heads=9, kv_heads=3, key_length=64, value_length=64)
        shape = msgspec.structs.replace(shape, weight_bytes=97 * MB, active_bytes=97 * MB, type_bytes=types)
        return FileFacts(name="m.gguf", format="gguf", quant="x", shape=shape)

    node = NodeFacts(
        name="n", cpus=2, memory_total_mb=8000, memory_available_mb=8000, membw_all_gbs=30, membw_one_gbs=16
    )
    q4, f16 = (options([facts(t)], [node], 2048)[0].tokens_per_second for t in ({"Q4_1": 97 * MB}, {"F16": 97 * MB}))
    assert q4 < f16
    assert active_type_bytes(msgspec.structs.replace(facts({"Q4_1": 97 * MB}).shape, active_bytes=48 * MB)) == {
        "Q4_1": 48 * MB
    }


TRUE = msgspec.structs.replace(
    DEFAULT_CPU, compute_ns_per_byte={**DEFAULT_CPU.compute_ns_per_byte, "Q4_1": 0.2, "Q8_0": 0.05}
)
"""A machine whose arithmetic is twice as slow as the defaults say."""
MODELS = {
    "q4": ({"Q4_1": 90 * MB, "F32": MB}, 12),
    "q8": ({"Q8_0": 95 * MB}, 7),
    "mixed": ({"Q4_1": 66 * MB, "Q8_0": 30 * MB}, 30),
    "f16": ({"F16": 100 * MB}, 4),
}


def _measured(k, models=MODELS, noise=None):
    noise = noise or {}
    return [
        Measured(
            read_bytes=sum(types.values()),
            threads=t,
            tokens_per_second=cpu_tokens_per_second(sum(types.values()), 30, 16, t, k, types, layers)
            * noise.get((name, t), 1.0),
            all_gbs=30,
            core_gbs=16,
            name=name,
            type_bytes=types,
            layers=layers,
        )
        for name, (types, layers) in models.items()
        for t in (1, 2)
    ]


def test_a_fit_that_estimates_models_it_never_saw_better_than_the_defaults_is_kept():
    verdict = judge_fit(_measured(TRUE), "test", memory=False)
    assert verdict.kept
    assert verdict.fit.compute_ns_per_byte["Q4_1"] == pytest.approx(0.2, rel=0.02)
    assert verdict.fit.holdout_error < 0.01 < verdict.defaults_error
    assert verdict.fit.holdout_error == pytest.approx(holdout_error(_measured(TRUE), memory=False), abs=1e-4)


def test_a_fit_worse_than_the_defaults_on_held_out_models_is_not_kept():
    # The defaults are right here; one noisy model drags the fit off for the others.
    points = _measured(DEFAULT_CPU, noise={("mixed", 1): 0.6, ("mixed", 2): 0.6})
    verdict = judge_fit(points, "test", memory=False)
    assert not verdict.kept
    assert verdict.fit.holdout_error >= verdict.defaults_error


def test_one_model_is_no_ground_to_keep_a_fit():
    points = _measured(TRUE, {"q4": MODELS["q4"]})
    assert not judge_fit(points, "test", memory=False).kept


def test_the_fit_says_its_worst_error_over_what_it_measured():
    k = fit_cpu(_measured(TRUE), "here", memory=False)
    assert k.source == "here" and 0 <= k.worst_error < 0.01


def test_a_prompts_reading_is_reckoned_at_what_llama_server_measured_here():
    from llmgw.modelplan import CARDS, prefill_tokens_per_second, verdict_seconds

    # SmolLM2-135M Q4_1, 2 threads: llama-server read a 505-token prompt at ~300 tok/s, wrote ~100 tok/s.
    prefill = prefill_tokens_per_second(134_515_008, threads=2)
    assert 285 < prefill < 315
    assert 0.8 < verdict_seconds(prefill, 100.0) < 1.0  # 256 tokens read, 8 written
    assert verdict_seconds(0.0, 100.0) == 0.0
    on_card = prefill_tokens_per_second(8_000_000_000, card=CARDS["h100"])
    assert 25_000 < on_card < 35_000  # 989 TFLOPS at half, 16 GFLOP a token


def test_a_fit_that_estimates_a_real_model_worse_than_the_defaults_is_refused_saying_by_how_much():
    # The generated models say the arithmetic is twice as slow; the real file served here runs as
    # the defaults say (its figure is the truth the fit must not spoil).
    real = {"smollm2": ({"Q4_1": 80 * MB, "F32": 5 * MB}, 30)}
    points = _measured(TRUE) + _measured(DEFAULT_CPU, real)
    verdict = judge_fit(points, "test", memory=False, real=frozenset({"smollm2"}))
    assert not verdict.kept
    [(name, fitted, defaults)] = verdict.worse_on
    assert name == "smollm2" and fitted > defaults + 0.05 and defaults < 0.01
    agreeing = _measured(TRUE) + _measured(TRUE, real)  # the real file agrees with the generated ones
    assert judge_fit(agreeing, "test", memory=False, real=frozenset({"smollm2"})).kept


def test_a_k_quant_files_types_cost_their_arithmetic_not_an_unmeasured_types():
    # Gemma 3 270M Q4_K_M's bytes a token by type: its Q5_0, Q4_K and Q6_K took the unmeasured
    # type's cost (close to none) and its plan was +50% over llama-bench.
    mix = {"Q8_0": 179_824_640, "Q5_0": 43_591_680, "Q4_K": 13_271_040, "Q6_K": 9_676_800, "F32": 223_744}
    k_types = {t: n for t, n in mix.items() if t not in ("Q8_0", "F32")}
    read = sum(mix.values())
    for threads in (1, 2):
        as_unmeasured = {"Q8_0": mix["Q8_0"], "F32": mix["F32"], "": sum(k_types.values())}
        plan = cpu_tokens_per_second(read, 33.7, 21.2, threads, DEFAULT_CPU, mix, 18)
        unmeasured = cpu_tokens_per_second(read, 33.7, 21.2, threads, DEFAULT_CPU, as_unmeasured, 18)
        assert plan < 0.8 * unmeasured


def test_the_real_files_weigh_as_much_as_the_generated_models_in_a_fit():
    # Eight generated figures of a machine whose arithmetic is slow, two of a real file that runs
    # 12% faster than they say (its layers are small, its cache use better): unweighted, the fit
    # follows the many; weighted, the real file the plan is for is estimated closer.
    real = {"smollm2": ({"Q4_1": 80 * MB, "F32": 5 * MB}, 30)}
    points = _measured(TRUE) + _measured(TRUE, real, noise={("smollm2", 1): 1.12, ("smollm2", 2): 1.12})
    mine = [p for p in points if p.name == "smollm2"]
    plain = worst_error(fit_cpu(points, "", memory=False), mine)
    weighed = worst_error(fit_cpu(points, "", memory=False, real=frozenset({"smollm2"})), mine)
    assert weighed < plain / 2, (plain, weighed)
    assert weighed < 0.05


def test_a_calibration_reads_at_the_rates_it_was_fitted_at_not_at_a_later_measurements():
    # A shared VM's memory rate measured at one moment and another differs by up to a quarter while
    # llama-bench's tokens a second do not: the fit turns its own moment's rates into tokens.
    points = _measured(TRUE)
    k = fit_cpu(points, "here", memory=False)
    assert (k.all_gbs, k.core_gbs) == (30, 16)
    q4 = {"Q4_1": 90 * MB}
    assert cpu_tokens_per_second(90 * MB, 22, 12, 2, k, q4, 12) == cpu_tokens_per_second(90 * MB, 30, 16, 2, k, q4, 12)
    assert cpu_tokens_per_second(90 * MB, 0, None, 1, k, q4, 12) > 0  # a node whose rate is not measured yet
    assert cpu_tokens_per_second(90 * MB, 22, 12, 2, DEFAULT_CPU, q4, 12) < cpu_tokens_per_second(
        90 * MB, 30, 16, 2, DEFAULT_CPU, q4, 12
    )  # the defaults read at the node's rate
    # a node reading three times as fast is another machine (the file copied there): its own rate
    assert cpu_tokens_per_second(90 * MB, 90, 48, 2, k, q4, 12) > cpu_tokens_per_second(90 * MB, 30, 16, 2, k, q4, 12)
    moved = [msgspec.structs.replace(p, all_gbs=20) if p.name == "q8" else p for p in points]
    assert fit_cpu(moved, "", memory=False).all_gbs == 0  # figures of several moments: each at its own
