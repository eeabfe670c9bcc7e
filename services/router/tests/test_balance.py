"""The balancer over fake replicas: pools by priority, within a pool the replica of least cost
(queued work against what of the prompt it does not hold, by weight), the index of prompt
blocks (calibrated by the engine's cached counts), and ejection."""

import math
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from llmgw.router.routing.balance import (
    REQUEST_BOUNDS,
    REQUEST_CHARS,
    Balancer,
    Candidate,
    prompt_blocks,
    text_blocks,
)

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


def test_affinity_yields_once_the_work_queued_on_its_replica_outweighs_reading_the_prompt_afresh():
    b = Balancer(seed=6)
    blocks = prompt_blocks("x" * 2048)  # 8 blocks: read afresh on an empty cache, 2108 characters
    b.served("cpu2", blocks, 500, 0)
    many = [Candidate(id=f"r{i}", slots=100) for i in range(4)] + [Candidate(id="cpu2", slots=100)]
    for _ in range(4):  # short requests in flight there: 4 x (128 + 256) queued, and its tail (60)
        b.started("cpu2")  # weighed 6 times: its cache holds all the pool's blocks, 5 times the mean
    assert b.pick(many, blocks, 0.0, size=2048 + 60) == (many[-1], "affinity")
    b.started("cpu2")  # one more outweighs reading it elsewhere
    choice, how = b.pick(many, blocks, 0.0, size=2048 + 60)
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


def test_a_popular_prefix_stays_on_its_replica_one_at_a_time_and_spills_over_when_they_pile_up():
    b = Balancer(seed=10)
    pool = [Candidate(id=f"r{i}", slots=8) for i in range(3)]
    blocks = prompt_blocks("p" * 1024)
    b.served("r0", blocks, 256, 0)
    for _ in range(30):  # one at a time: nothing waits on r0, and it holds the prefix
        choice, how = b.pick(pool, blocks, 0.0, size=1100)
        sent = b.started(choice.id, blocks, 1100)
        b.finished(choice.id, True, blocks, sent.work)
        assert (choice.id, how) == ("r0", "affinity")
    picks = []
    for _ in range(20):  # all at once: 3 wait on r0 (each 76 + 256), then reading it elsewhere weighs less
        choice, _ = b.pick(pool, blocks, 0.0, size=1100)
        b.started(choice.id, blocks, 1100)
        picks.append(choice.id)
    assert picks[:3] == ["r0"] * 3 and picks[3] != "r0" and len(set(picks)) == 3
    assert max(Counter(picks).values()) <= 10  # shared, not piled onto one


def test_a_conversation_stays_with_the_replica_holding_its_history_however_unevenly_they_spread():
    """Conversations land unevenly (here four on r0, one each elsewhere); each turn carries the
    history before it. Moving a turn costs reading the whole history again, so none moves while
    nothing waits (an earlier rule moved them once r0 had taken more than its share of recent
    requests)."""
    b = Balancer(seed=14)
    pool = [Candidate(id=f"r{i}", slots=2) for i in range(3)]
    homes = ["r0", "r0", "r0", "r0", "r1", "r2"]
    history = [f"Conversation {c}: " + "tell me more about the river " * 20 for c in range(len(homes))]
    for c, home in enumerate(homes):
        b.served(home, prompt_blocks(history[c]), 150, 0, size=len(history[c]))
    for turn in range(8):
        for c, home in enumerate(homes):
            history[c] += f" Turn {turn}: and then? " + "it went on downstream " * 6
            blocks = prompt_blocks(history[c])
            choice, how = b.pick(pool, blocks, 0.0, size=len(history[c]))
            assert (choice.id, how) == (home, "affinity")
            sent = b.started(choice.id, blocks, len(history[c]))
            b.finished(choice.id, True, blocks, sent.work)
            b.served(choice.id, blocks, 200, 150, sent.believed, len(history[c]))


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
    believed = b.started("r0", blocks).believed
    assert believed == 0 and b.held("r0", blocks) == 8  # claimed while in flight
    b.finished("r0", False, blocks)  # it failed: no word that r0 holds it
    assert b.held("r0", blocks) == 0
    believed = b.started("r0", blocks).believed
    b.finished("r0", True, blocks)
    b.served("r0", blocks, prompt_tokens=512, cached_tokens=0, believed=believed)  # a miss it never claimed to hold
    assert b.indexes["r0"].capacity == 65536 and b.held("r0", blocks) == 8


def test_a_hit_on_the_shared_part_of_a_prompt_does_not_shrink_the_index():
    """The engine caches a prompt's shared prefix; its question (in the last, partial block) is
    new. The blocks the index matched are all in that prefix: nothing it believed was wrong."""
    b = Balancer(seed=13)
    document = "Document 7: " + "river stone garden lamp " * 40  # ~970 characters: 3 whole blocks
    first = "user: " + document + "\nuser: Question 1?"
    b.served("r0", prompt_blocks(first), prompt_tokens=250, cached_tokens=0, size=len(first))
    capacity = b.indexes["r0"].capacity
    again = "user: " + document + "\nuser: Question 2, a longer one this time?"
    blocks = prompt_blocks(again)
    believed = b.started("r0", blocks).believed
    assert believed == 3
    b.finished("r0", True, blocks)
    b.served("r0", blocks, prompt_tokens=260, cached_tokens=240, believed=believed, size=len(again))
    assert b.indexes["r0"].capacity == capacity and b.held("r0", blocks) == len(blocks)


def test_a_new_prefix_goes_where_the_cache_has_room_and_new_ones_on_idle_replicas_spread_evenly():
    b = Balancer(seed=15)
    pool = [Candidate(id=f"r{i}", slots=2) for i in range(3)]
    for d in range(4):  # r0 holds four documents, r1 one, r2 two
        b.served("r0", prompt_blocks(f"Document {d}: " + "stone " * 200), 300, 0)
    b.served("r1", prompt_blocks("Document 4: " + "stone " * 200), 300, 0)
    for d in (5, 6):
        b.served("r2", prompt_blocks(f"Document {d}: " + "stone " * 200), 300, 0)
    fresh = prompt_blocks("Document 7: " + "lamp " * 200)
    assert b.pick(pool, fresh, 0.0) == (pool[1], "least-loaded")
    b = Balancer(seed=16)  # nothing held anywhere, nothing in flight: by the fewest recent requests
    picks = []
    for d in range(9):
        blocks = prompt_blocks(f"Question {d}: " + "why " * 100)
        choice, _ = b.pick(pool, blocks, 0.0)
        sent = b.started(choice.id, blocks)
        b.finished(choice.id, True, blocks, sent.work)
        picks.append(choice.id)
    assert Counter(picks) == {"r0": 3, "r1": 3, "r2": 3}


def test_a_full_replica_holding_a_long_prefix_still_takes_it_until_its_queue_outweighs_a_fresh_read():
    b = Balancer(seed=17)
    pool = [Candidate(id="a", slots=2), Candidate(id="b", slots=2)]
    blocks = prompt_blocks("d" * 4096)
    b.served("a", blocks, 1000, 0)
    for _ in range(15):  # questions on it, each 4 bytes to read and 256 for its turn: 15 x 260 queued
        b.started("a", blocks, 4100)
    assert b.pick(pool, blocks, 0.0, size=4100) == (pool[0], "affinity")
    b.started("a", blocks, 4100)  # 16 x 260 outweigh reading all 4,100 bytes on b's empty cache
    assert b.pick(pool, blocks, 0.0, size=4100) == (pool[1], "least-loaded")
    b.started("b", [], 10)
    b.started("b", [], 10)  # every slot taken: the pool's cheapest, saturated
    assert b.pick(pool, blocks, 0.0, size=4100)[1] == "saturated"


def test_the_engines_own_tokens_held_count_in_the_balancers_blocks_of_text():
    """KV events say a replica holds 48 of the prompt's 64 tokens; at 16 bytes a token that is 3 of
    its 4 blocks of 256 bytes: a quarter is left to read, not none."""
    assert text_blocks(48, 64, 1024) == 3 and text_blocks(0, 64, 1024) == 0 and text_blocks(5, 0, 0) == 0
    b = Balancer(seed=18)
    pool = [Candidate(id="a", slots=4), Candidate(id="b", slots=4)]
    blocks = prompt_blocks("e" * 1024)
    for _ in range(2):  # two short requests queued on a: 2 x (256 + 256) outweigh its quarter, not a whole miss
        b.started("a", [], 256)
    held = {"a": text_blocks(48, 64, 1024), "b": 0}.get
    assert b.pick(pool, blocks, 0.0, held=held, size=1024) == (pool[0], "affinity")
    b.started("a", [], 256)
    assert b.pick(pool, blocks, 0.0, held=held, size=1024) == (pool[1], "least-loaded")


def _timed(b: Balancer, replica: str) -> None:
    """llama-server's own timings for SmolLM2 on one thread, a question on a document
    (`tests/bench/routing.py`'s): a miss read ~850 characters in ~870 ms, a hit the question's
    ~80 in ~150 ms (a fixed ~75 ms of it); its one token's `predicted_ms` is 0."""
    for _ in range(5):
        b.measured(replica, 850, 870.0)
        b.measured(replica, 80, 150.0)


def test_what_a_request_weighs_is_learned_from_its_engines_timings_and_kept_within_bounds():
    b = Balancer(seed=21)
    assert b.request_cost("r0") == REQUEST_CHARS  # nothing said yet
    _timed(b, "r0")
    assert 70 <= b.request_cost("r0") <= 90  # ~75 ms fixed over ~0.94 ms a character
    assert b.request_cost("r1") == REQUEST_CHARS  # each replica its own
    for chars, ms in ((500, 50.0), (1300, 130.0)) * 4:  # 0.1 ms a character
        b.measured("r2", chars, ms + 5000.0)  # and five seconds more each
        b.measured("r3", chars, 10 * ms)  # 1 ms a character, none more
    assert b.request_cost("r2") == REQUEST_BOUNDS[1]  # a stalled engine's requests weigh no more than this
    assert b.request_cost("r3") == REQUEST_BOUNDS[0]  # nor a request without a fixed part, no less
    # reads of about one length, some three times slower (an engine sharing its cores), cannot
    # tell a fixed part from the rate: none is counted; a least-squares line through these swung
    # from nothing to the upper bound and back as they came
    for ms in (800.0, 600.0, 2400.0, 900.0) * 4:
        b.measured("r5", 470, ms)
        b.measured("r5", 740, ms)
    assert b.request_cost("r5") == REQUEST_BOUNDS[0]  # all of it reading: an answer of one token weighs nothing
    for i, bad in enumerate(((0, 100.0), (-5, 100.0), (100, 0.0), (100, -1.0), (100, math.inf), (100, math.nan))):
        for _ in range(4):  # nothing read, no time, a time beyond measure: nothing said
            b.measured(f"bad{i}", *bad)
        assert b.request_cost(f"bad{i}") == REQUEST_CHARS, bad
    b.forget_replica("r0")
    assert b.request_cost("r0") == REQUEST_CHARS
    b.keep_only(["r1"])  # a replica known only by its timings is forgotten with the others
    assert set(b.paces) <= {"r1"}


def test_a_documents_queued_questions_weigh_what_its_engine_says_and_it_stays_where_it_is_held():
    """Six questions on one document queued where it is held: by the constant (256 characters
    each) they outweigh reading it afresh on an idle replica and it moves, read twice and
    pushing another document out; by the engine's timings (~80 each) it stays."""
    document = "Document 3: " + "river stone garden lamp " * 35  # ~850 characters
    question = "user: " + document + "\nuser: What does the garden hold?"
    blocks, size = prompt_blocks(question), len(question)
    pool = [Candidate(id=f"r{i}", slots=2) for i in range(3)]
    picks = []
    for timed in (False, True):
        b = Balancer(seed=22)
        for i, r in enumerate(pool):  # each holds a document of its own
            held = question if i == 0 else question.replace("Document 3", f"Document {i + 10}")
            b.served(r.id, prompt_blocks(held), 170, 0, size=len(held))
            if timed:
                _timed(b, r.id)
        for _ in range(6):
            b.started("r0", blocks, size)
        picks.append(b.pick(pool, blocks, 0.0, size=size)[0].id)
    assert picks[0] in ("r1", "r2") and picks[1] == "r0"


def test_an_engine_sharing_its_cores_answering_some_reads_three_times_slower_moves_the_weight_little():
    b = Balancer(seed=23)
    _timed(b, "r0")
    calm = b.request_cost("r0")
    for ms in (2400.0, 450.0, 2600.0, 480.0, 2300.0, 470.0):  # the same reads, three times slower now and then
        b.measured("r0", 850 if ms > 1000 else 80, ms)
    assert calm / 2 <= b.request_cost("r0") <= calm * 2
