"""The balancer over fake replicas: pools by priority, least outstanding by weight, prefix
affinity (calibrated by the engine's cached counts), and ejection."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from llmgw.router.routing.balance import Balancer, Candidate, prompt_blocks

CARD = Candidate(id="card", priority=10, slots=2)
CPU1 = Candidate(id="cpu1", priority=0, slots=2)
CPU2 = Candidate(id="cpu2", priority=0, slots=2)


def test_the_card_pool_takes_requests_until_its_slots_are_full_then_the_cpus():
    b = Balancer(seed=1)
    picks = []
    for _ in range(5):
        choice, _ = b.pick([CPU1, CARD, CPU2], [], 0.0)
        b.started(choice.id)
        picks.append(choice.id)
    assert picks[:2] == ["card", "card"] and sorted(picks[2:4]) == ["cpu1", "cpu2"]


def test_a_cpu_replica_never_takes_a_request_a_free_card_could():
    b = Balancer(seed=2)
    for _ in range(100):
        choice, _ = b.pick([CPU1, CPU2, CARD], [], 0.0)
        assert choice.id == "card"
        b.started("card")
        b.finished("card", True)


def test_when_every_pool_is_saturated_the_highest_queues_it():
    b = Balancer(seed=3)
    for r in ("card", "card", "cpu1", "cpu1"):
        b.started(r)
    choice, how = b.pick([CARD, CPU1], [], 0.0)
    assert (choice.id, how) == ("card", "saturated")


def test_weights_share_requests_in_proportion():
    heavy, light, third = (
        Candidate(id="h", weight=3, slots=1000),
        Candidate(id="l", slots=1000),
        Candidate(id="t", slots=1000),
    )
    b = Balancer(seed=4)
    for _ in range(600):
        choice, _ = b.pick([heavy, light, third], [], 0.0)
        b.started(choice.id)
    counts = Counter({r: b.outstanding[r] for r in ("h", "l", "t")})
    assert 330 <= counts["h"] <= 390 and 100 <= counts["l"] <= 140  # 3:1:1 of 600


def test_a_prompt_sharing_a_prefix_goes_to_the_replica_that_served_it():
    b = Balancer(seed=5)
    system = "You answer questions about the llmgw handbook. " * 40
    first = prompt_blocks(system + "What is a profile?")
    b.served("cpu2", first, prompt_tokens=500, cached_tokens=0)
    choice, how = b.pick([CPU1, CPU2], prompt_blocks(system + "What is a replica?"), 0.0)
    assert (choice.id, how) == ("cpu2", "affinity")


def test_affinity_yields_when_its_replica_is_overloaded_against_the_pool():
    b = Balancer(seed=6, overload=1.25)
    blocks = prompt_blocks("x" * 2048)
    b.served("cpu2", blocks, 500, 0)
    many = [Candidate(id=f"r{i}", slots=100) for i in range(4)] + [Candidate(id="cpu2", slots=100)]
    for _ in range(6):
        b.started("cpu2")
    choice, how = b.pick(many, blocks, 0.0)
    assert choice.id != "cpu2" and how == "least-loaded"


def test_the_engines_cached_count_shrinks_an_index_that_believed_too_much():
    b = Balancer(seed=7)
    a, bb, c = (prompt_blocks(ch * 256 * 8) for ch in "abc")
    for blocks in (a, bb, c):
        b.served("cpu1", blocks, prompt_tokens=512, cached_tokens=0)
    assert [b.held("cpu1", x) for x in (a, bb, c)] == [8, 8, 8]
    b.served("cpu1", a, prompt_tokens=512, cached_tokens=0)  # believed all 8 held; the engine had evicted them
    assert [b.held("cpu1", x) for x in (a, bb, c)] == [8, 0, 8]  # the index now holds 16 blocks: b, the oldest, went
    b.served("cpu1", c, prompt_tokens=512, cached_tokens=512)  # a full hit on a full index: room to grow again
    assert b.indexes["cpu1"].capacity == 18


def test_blocks_chain_so_a_shared_block_means_a_shared_prefix():
    a, b = prompt_blocks("A" * 256 + "B" * 256), prompt_blocks("C" * 256 + "B" * 256)
    assert a[1] != b[1] and len(a) == 2 and prompt_blocks("short") == []


def test_failed_requests_alone_never_eject_a_replica():
    b = Balancer(seed=8)
    for _ in range(10):  # refused, 5xx: suspicions its probe decides
        b.started("cpu1")
        b.finished("cpu1", False)
    assert b.failures["cpu1"] == 10 and b.pick([CPU1], [], 100.0)[0].id == "cpu1"


def test_a_replica_whose_probe_failed_is_ejected_doubling_while_it_fails_until_a_probe_answers():
    b = Balancer(seed=8, eject_s=10)
    assert b.eject("cpu1", 100.0) == 110.0
    assert b.pick([CPU1], [], 105.0) == (None, "none") and b.out("cpu1", 105.0)
    assert b.pick([CPU1], [], 111.0)[0].id == "cpu1"
    assert b.eject("cpu1", 111.0) == 131.0  # failing again: twice as long
    for _ in range(6):
        b.eject("cpu1", 200.0)
    assert b.ejected["cpu1"] == 300.0  # at most ten times eject_s
    b.healthy("cpu1")
    assert b.pick([CPU1], [], 201.0)[0].id == "cpu1" and not b.failures.get("cpu1") and not b.strikes


@given(st.lists(st.tuples(st.sampled_from(["card", "cpu1", "cpu2"]), st.booleans()), max_size=60))
def test_outstanding_never_goes_negative_and_excluded_replicas_are_never_picked(events):
    b = Balancer(seed=9)
    for rid, start in events:
        if start:
            b.started(rid)
        else:
            b.finished(rid, True)
        assert b.outstanding.get(rid, 0) >= 0
        choice, _ = b.pick([CARD, CPU1, CPU2], [], 0.0, exclude={"card"})
        assert choice.id != "card"


def test_a_popular_prefix_spills_over_once_its_replica_took_more_than_its_share():
    b = Balancer(seed=10)
    pool = [Candidate(id=f"r{i}", slots=8) for i in range(3)]
    blocks = prompt_blocks("p" * 1024)
    b.served("r0", blocks, 256, 0)
    picks = []
    for _ in range(30):  # one at a time: never overloaded by requests in flight
        choice, _ = b.pick(pool, blocks, 0.0)
        b.started(choice.id)
        b.finished(choice.id, True)
        picks.append(choice.id)
    assert picks[:2] == ["r0"] * 2  # affinity first
    assert 8 <= picks.count("r0") <= 20 and len(set(picks)) == 3  # then shared, not piled onto one


def test_a_prefix_sent_to_a_replica_draws_the_next_ones_there_before_its_answer_comes():
    """A replica is believed to hold a prompt from when the prompt is sent to it (its engine
    takes it in first), not only once it answered: questions about one document arriving while
    the first is still being read go where it is being read."""
    b = Balancer(seed=11)
    pool = [Candidate(id=f"r{i}", slots=2) for i in range(3)]
    docs = [prompt_blocks(f"Document {d}: " + "word " * 300) for d in range(3)]
    first = {}
    for d, blocks in enumerate(docs):  # three documents, one each, none answered yet
        choice, _ = b.pick(pool, blocks, 0.0)
        first[d] = choice.id
        b.started(choice.id, blocks)
    for d, blocks in enumerate(docs):  # a second question about each, the first still in flight
        choice, how = b.pick(pool, blocks + prompt_blocks("x" * 256), 0.0)
        assert (choice.id, how) == (first[d], "affinity")


def test_a_claim_that_came_to_nothing_is_dropped_and_does_not_shrink_the_index():
    b = Balancer(seed=12)
    blocks = prompt_blocks("y" * 256 * 8)
    believed = b.started("r0", blocks)
    assert believed == 0 and b.held("r0", blocks) == 8  # claimed while in flight
    b.finished("r0", False, blocks)  # it failed: no word that r0 holds it
    assert b.held("r0", blocks) == 0
    believed = b.started("r0", blocks)
    b.finished("r0", True, blocks)
    b.served("r0", blocks, prompt_tokens=512, cached_tokens=0, believed=believed)  # a miss it never claimed to hold
    assert b.indexes["r0"].capacity == 65536 and b.held("r0", blocks) == 8


def test_a_hit_on_the_shared_part_of_a_prompt_does_not_shrink_the_index():
    """The engine caches a prompt's shared prefix; its question (in the last, partial block) is
    new. The blocks the index matched are all in that prefix: nothing it believed was wrong."""
    b = Balancer(seed=13)
    document = "Document 7: " + "river stone garden lamp " * 40  # ~970 characters: 3 whole blocks
    first = "user: " + document + "\nuser: Question 1?"
    b.served("r0", prompt_blocks(first), prompt_tokens=250, cached_tokens=0, prompt_chars=len(first))
    capacity = b.indexes["r0"].capacity
    again = "user: " + document + "\nuser: Question 2, a longer one this time?"
    blocks = prompt_blocks(again)
    believed = b.started("r0", blocks)
    assert believed == 3
    b.finished("r0", True, blocks)
    b.served("r0", blocks, prompt_tokens=260, cached_tokens=240, believed=believed, prompt_chars=len(again))
    assert b.indexes["r0"].capacity == capacity and b.held("r0", blocks) == len(blocks)
