"""The catalog's rules as table tests, and properties no sequence of changes may break."""

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.bus import BadRequest, BusError, Conflict
from llmgw.catalog.core import check_editable, check_model, check_removable, counts_of, tally_purge
from llmgw.catalog.edits import (
    apply_change,
    restart,
    scale,
    set_aliases,
    set_context,
    set_gpus,
    set_replicas,
    set_resources,
    start,
    stop,
    strip_gpu_args,
)
from llmgw.proto import FilePlace, Model, ModelEntry, Profile, Scaling, WeightsDeleted, fingerprint
from llmgw.proto.catalog import (
    RestartModel,
    ScaleModel,
    SetContext,
    SetGpus,
    SetReplicas,
    StartModel,
    StopModel,
)


def gguf_model(**kw):
    profiles = [
        Profile(name="gpu", gpus=1, priority=10, args=["-ngl", "99", "--flash-attn", "on", "--tensor-split=1,1"])
    ]
    return Model(name="m", source="o/r/m.gguf", profiles=profiles, **kw)


def two_profiles():
    return Model(
        name="m", source="o/r/m.gguf", profiles=[Profile(name="gpu", gpus=1, priority=10), Profile(name="cpu")]
    )


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        (["-ngl", "99", "-c", "4096"], ["-c", "4096"]),
        (["--n-gpu-layers=99", "--split-mode", "row", "-ts", "3,1", "--main-gpu", "1", "-mg=0"], []),
        (["--flash-attn", "on", "-sm=layer"], ["--flash-attn", "on"]),
        ([], []),
    ],
)
def test_the_flags_that_put_layers_on_cards_are_dropped_with_their_values(args, kept):
    assert strip_gpu_args(args) == kept


def test_counts_set_per_profile_make_the_scaling_their_sum():
    m = set_replicas(two_profiles(), {"gpu": 7, "cpu": 4})
    assert counts_of(m) == {"gpu": 7, "cpu": 4} and m.scaling == Scaling(min=11, max=11)


def test_a_profile_not_named_keeps_its_count():
    m = set_replicas(set_replicas(two_profiles(), {"gpu": 7, "cpu": 4}), {"gpu": 9})
    assert counts_of(m) == {"gpu": 9, "cpu": 4} and m.scaling.min == 13


@pytest.mark.parametrize(
    ("counts", "message"),
    [({"tpu": 1}, "has no profile tpu; its profiles: cpu, gpu"), ({"gpu": 0, "cpu": 0}, "stop the model instead")],
)
def test_an_impossible_count_is_refused_saying_why(counts, message):
    with pytest.raises(BadRequest, match=message):
        set_replicas(two_profiles(), counts)


def test_cpu_memory_adds_a_cpu_profile_below_every_other_without_the_gpu_flags():
    m = set_replicas(gguf_model(), {"gpu": 2, "cpu": 3}, cpu_memory_mb=16000, cpu_cores=8)
    cpu = next(p for p in m.profiles if p.name == "cpu")
    assert (cpu.gpus, cpu.priority, cpu.host_memory_mb, cpu.cpu_cores) == (0, 9, 16000, 8)
    assert cpu.args == ["--flash-attn", "on"] and counts_of(m) == {"gpu": 2, "cpu": 3}


def test_a_model_not_served_by_llama_cpp_cannot_get_a_cpu_profile():
    vllm = Model(name="v", source="o/r/weights", profiles=[Profile(name="gpu", engine="vllm", gpus=1)])
    with pytest.raises(BadRequest, match="served by vllm, not llama.cpp"):
        set_replicas(vllm, {"gpu": 1}, cpu_memory_mb=8000)


def test_a_catalog_where_counts_and_scaling_disagree_is_refused_with_both_figures():
    m = two_profiles()
    profiles = [msgspec.structs.replace(p, replicas=n) for p, n in zip(m.profiles, (7, 4), strict=True)]
    m = msgspec.structs.replace(m, profiles=profiles, scaling=Scaling(min=5, max=5))
    with pytest.raises(BadRequest, match=r"add up to 11 \(gpu=7, cpu=4\) but its scaling is min 5, max 5"):
        check_model(m)


def test_scaling_to_another_total_ends_the_counts_and_the_same_total_keeps_them():
    counted = set_replicas(two_profiles(), {"gpu": 7, "cpu": 4})
    assert counts_of(scale(counted, Scaling(min=11, max=11))) == {"gpu": 7, "cpu": 4}
    assert counts_of(scale(counted, Scaling(min=3, max=6))) is None


def test_stop_keeps_the_counts_and_start_brings_them_back_exactly():
    counted = set_replicas(two_profiles(), {"gpu": 7, "cpu": 4})
    stopped = stop(counted)
    assert stopped.scaling == Scaling(min=0, max=0) and counts_of(stopped) == {"gpu": 7, "cpu": 4}
    check_model(stopped)
    assert start(stopped) == counted


def test_a_scaling_set_starts_a_stopped_model():
    assert scale(stop(two_profiles()), Scaling(min=2, max=2)).stopped is None


@pytest.mark.parametrize(("op", "message"), [(stop, "already stopped"), (start, "is not stopped")])
def test_stopping_twice_or_starting_a_running_model_is_a_conflict(op, message):
    model = stop(two_profiles()) if op is stop else two_profiles()
    with pytest.raises(Conflict, match=message):
        op(model)


_changes = st.one_of(
    st.builds(
        SetContext, name=st.just("m"), context=st.integers(128, 9000), max_output=st.none() | st.integers(1, 9000)
    ),
    st.builds(SetGpus, name=st.just("m"), gpus=st.dictionaries(st.just("gpu"), st.integers(0, 4))),
    st.sampled_from([StopModel(name="m"), StartModel(name="m"), RestartModel(name="m")]),
    st.builds(
        ScaleModel,
        name=st.just("m"),
        scaling=st.integers(0, 6).flatmap(lambda lo: st.builds(Scaling, min=st.just(lo), max=st.integers(lo, 8))),
    ),
    st.builds(
        SetReplicas,
        name=st.just("m"),
        counts=st.dictionaries(st.sampled_from(["gpu", "cpu"]), st.integers(0, 5), max_size=2),
    ),
)


@given(st.lists(_changes, max_size=12))
def test_no_sequence_of_changes_leaves_counts_and_scaling_disagreeing_or_a_stopped_model_forgetting(changes):
    model = two_profiles()
    for change in changes:
        try:
            changed = apply_change(model, change)
        except (BadRequest, Conflict):
            continue  # refused: the model is untouched
        if isinstance(change, StopModel):
            assert changed.stopped == model.scaling and counts_of(changed) == counts_of(model)
        model = changed
        check_model(model)
        counts = counts_of(model)
        if counts is not None:
            total = sum(counts.values())
            assert (model.stopped or model.scaling) == Scaling(min=total, max=total)


def test_the_context_changes_and_the_longest_answer_must_fit_in_it():
    m = set_context(two_profiles(), 8192, 1024)
    assert (m.context, m.max_output) == (8192, 1024)
    with pytest.raises(BadRequest, match="max_output 9000 does not fit in context 8192"):
        set_context(m, None, 9000)


def test_gpus_change_between_card_counts_only():
    assert set_gpus(two_profiles(), {"gpu": 4}).profiles[0].gpus == 4
    with pytest.raises(BadRequest, match="a CPU profile is its own profile"):
        set_gpus(two_profiles(), {"cpu": 2})
    with pytest.raises(BadRequest, match="no profile tpu"):
        set_gpus(two_profiles(), {"tpu": 2})


def test_aliases_are_added_and_dropped_and_an_absent_one_cannot_be_dropped():
    m = set_aliases(two_profiles(), ["a", "b"], [])
    assert set_aliases(m, ["c"], ["a"]).aliases == ["b", "c"]
    with pytest.raises(BadRequest, match="has no alias zz"):
        set_aliases(m, [], ["zz"])


def test_the_fingerprint_ignores_counts_but_not_the_context_or_the_cards():
    m = two_profiles()
    counted = set_replicas(m, {"gpu": 7, "cpu": 4})
    assert fingerprint(m, m.profiles[0]) == fingerprint(counted, counted.profiles[0])
    assert fingerprint(m, m.profiles[0]) != fingerprint(set_context(m, 8192, None), m.profiles[0])
    more = set_gpus(m, {"gpu": 2})
    assert fingerprint(m, m.profiles[0]) != fingerprint(more, more.profiles[0])
    shorter = set_context(m, None, 512)
    assert fingerprint(m, m.profiles[0]) == fingerprint(shorter, shorter.profiles[0])  # applies at once
    roomier = set_resources(m, "cpu", 32 * 1024, 8)
    assert fingerprint(m, m.profiles[1]) != fingerprint(roomier, roomier.profiles[1])  # its replicas are replaced
    assert fingerprint(m, m.profiles[0]) == fingerprint(roomier, roomier.profiles[0])  # the other's are not


def test_resources_change_one_profiles_memory_or_cores_and_keep_what_is_not_said():
    m = two_profiles()
    cpu = {p.name: p for p in m.profiles}["cpu"]
    more = {p.name: p for p in set_resources(m, "cpu", 48 * 1024, None).profiles}["cpu"]
    assert (more.host_memory_mb, more.cpu_cores) == (48 * 1024, cpu.cpu_cores)
    cores = {p.name: p for p in set_resources(m, "cpu", None, 12).profiles}["cpu"]
    assert (cores.host_memory_mb, cores.cpu_cores) == (cpu.host_memory_mb, 12)
    with pytest.raises(BadRequest, match="has no profile big; its profiles: cpu, gpu"):
        set_resources(m, "big", 1024, None)
    with pytest.raises(BadRequest, match="say what to change: its memory, its cores, or both"):
        set_resources(m, "cpu", None, None)


def test_a_restart_makes_every_replica_stale_and_a_stopped_model_cannot_restart():
    m = two_profiles()
    again = restart(m)
    assert again.generation == 1
    assert all(fingerprint(m, p) != fingerprint(again, p) for p in m.profiles)
    with pytest.raises(Conflict, match="is stopped: nothing runs to restart"):
        restart(stop(m))


@pytest.mark.parametrize(
    "kind",
    [
        lambda **kw: RestartModel(name="m", **kw),
        lambda **kw: SetContext(name="m", context=8192, **kw),
        lambda **kw: SetGpus(name="m", gpus={"gpu": 2}, **kw),
    ],
)
def test_a_change_that_restarts_says_whether_in_place_or_beside(kind):
    in_place = apply_change(two_profiles(), kind(in_place=True))
    assert in_place.rollout == "in-place"
    assert apply_change(in_place, kind()).rollout == "surge"


def test_a_purge_tallies_what_each_place_deleted_and_keeps_what_an_error_left_unknown():
    entry = ModelEntry(model=Model(name="m", source="o/r/m.gguf"), revision=2)
    answers = [
        WeightsDeleted(where="node-a", deleted=["o/r/m.gguf"]),
        WeightsDeleted(where="node-b", kept=[FilePlace(source="o/r/m.gguf", where="node-b", why="in use")]),
        BusError("no reply from the mirror"),
    ]
    report = tally_purge(entry, ["o/r/m.gguf"], [], answers)
    assert report.deleted == [FilePlace(source="o/r/m.gguf", where="node-a")]
    assert [(k.where, k.why) for k in report.kept] == [("node-b", "in use"), ("unknown", "no reply from the mirror")]


def test_a_declared_model_or_one_at_another_revision_cannot_be_changed_and_a_fallback_cannot_go():
    declared = ModelEntry(model=two_profiles(), revision=4, declared_in="models.yaml")
    with pytest.raises(BadRequest, match="declared in models.yaml; change it there"):
        check_editable(declared)
    with pytest.raises(Conflict, match="at revision 4, not 3"):
        check_editable(ModelEntry(model=two_profiles(), revision=4), 3)
    with pytest.raises(BadRequest, match="'m' is a fallback of b"):
        check_removable("m", {"b": Model(name="b", source="o/r/b.gguf", fallbacks=["m"])})
