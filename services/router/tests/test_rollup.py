"""Usage summed into slots (`llmgw.router.usage.rollup`): a report from slots and the stream after them
equals a plain sum of every request, however the stream's requests came (late, ahead of the
stream's clock) and however the routers summing it were stopped, restarted or run side by side.

The bucket and the stream are simulated here as `usage.py` uses them (compare-and-set writes,
reads by sequence); tests/test_usage.py does the same against a real nats-server."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.proto import UsageQuery, UsageRecord, UsageRolled, UsageSlot
from llmgw.proto.router import USAGE_MOST_LATE_S, USAGE_SLOT_GRACE_S, USAGE_SLOT_S
from llmgw.router.usage.rollup import GROUPS, Roller, Tally, add_late, at, slot_of, slot_parts, usage_part

T0 = 1_800_000_000.0
"""A slot start (a multiple of USAGE_SLOT_S)."""

Message = tuple[int, float, list[UsageRecord]]


class Bucket:
    """The usage-slots bucket as `UsageBook` writes it: entries made once, late requests added
    (compare-and-set, made where the slot closed empty), the rolled mark moved forward only."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, str], list[UsageSlot]] = {}
        """(slot start, group) -> its parts."""
        self.rolled: UsageRolled | None = None

    def write(self, entries: list[UsageSlot]) -> None:
        for group in GROUPS:
            self.entries.setdefault((entries[0].start, group), [e for e in entries if e.group == group])

    def add_late(self, start: int, records: list[tuple[int, UsageRecord]]) -> None:
        for group in GROUPS:
            if (start, group) not in self.entries:
                first = records[0][0]
                empty = UsageSlot(start=start, group=group, first=first, upto=first - 1)
                self.entries[start, group] = [add_late(empty, records)]
            else:
                self.entries[start, group] = [add_late(e, records) or e for e in self.entries[start, group]]

    def mark(self, rolled: UsageRolled) -> None:
        if self.rolled is None or rolled.resume > self.rolled.resume:
            self.rolled = rolled


class Summer:
    """One router summing: from the rolled mark, a batch at a time, as `UsageBook._roll` does."""

    def __init__(self, bucket: Bucket, stream: list[Message]) -> None:
        self.bucket, self.stream = bucket, stream
        rolled = bucket.rolled or UsageRolled(resume=1)
        self.roller = Roller(rolled.resume, rolled.horizon)

    def step(self, n: int) -> None:
        batch = self.stream[self.roller.next - 1 : self.roller.next - 1 + n]
        late: dict[int, list] = {}
        closed = []
        for seq, stored, records in batch:
            some_late, some_closed = self.roller.feed(seq, stored, records)
            for item in some_late:
                late.setdefault(item.start, []).extend(item.records)
            closed += some_closed
        for c in closed:
            self.bucket.write(c.entries)
        for start, records in late.items():
            self.bucket.add_late(start, records)
        if closed:
            self.bucket.mark(self.roller.rolled())


def report(bucket: Bucket, stream: list[Message], query: UsageQuery, now: float) -> dict:
    """`UsageBook.report` over the simulated bucket and stream."""
    resume = bucket.rolled.resume if bucket.rolled else 0
    head = next((m for m in stream if m[1] >= query.since - USAGE_SLOT_GRACE_S), None)
    if head is None:
        return {}
    lowest = slot_of(max(query.since, head[1] - USAGE_MOST_LATE_S))
    starts = range(lowest, slot_of(now + 3600) + USAGE_SLOT_S, USAGE_SLOT_S)
    slots = {s: bucket.entries[s, query.group_by] for s in starts if (s, query.group_by) in bucket.entries}
    tally = Tally(query, slots, resume)
    tail = max(head[0], resume)
    if (edge := tally.edge_range()) is not None:
        first, last = edge
        for seq, stored, records in stream[first - 1 : min(last, tail - 1)]:
            tally.count(seq, stored, records)
    for seq, stored, records in stream[tail - 1 :]:
        tally.count(seq, stored, records)
    return _rows(tally.report())


def plain_sum(stream: list[Message], query: UsageQuery) -> dict:
    """Every request since `query.since`, one by one."""
    out: dict = {}
    for _, stored, records in stream:
        for r in records:
            t = at(r, stored)
            if t >= query.since:
                start = float(t // query.bucket_s * query.bucket_s) if query.bucket_s else 0.0
                row = out.setdefault((start, getattr(r, query.group_by)), [0, 0, 0, 0, 0])
                for i, v in enumerate((1, r.status >= 400, r.prompt_tokens, r.cached_tokens, r.completion_tokens)):
                    row[i] += v
    return out


def _rows(rows) -> dict:
    return {
        (r.start, r.group): [r.requests, r.errors, r.prompt_tokens, r.cached_tokens, r.completion_tokens] for r in rows
    }


@st.composite
def streams(draw) -> list[Message]:
    """Messages kept over a few slots; most requests end just before, some long before (a router's
    clock behind, a message held up: late for their slot), some after (a clock ahead)."""
    stream, stored, n = [], T0, 0
    for seq in range(1, draw(st.integers(1, 80)) + 1):
        stored += draw(st.sampled_from([0.0, 0.5, 7.0, 40.0, 130.0, 400.0]))
        records = []
        for _ in range(draw(st.integers(1, 3))):
            lag = draw(st.sampled_from([0.02, 0.02, 0.02, 1.0, 3.0, 90.0, 500.0, 1500.0, 1e6, -30.0, -4000.0]))
            n += 1
            records.append(
                UsageRecord(
                    request_id=f"r{n}",
                    time=stored - lag,
                    key=draw(st.sampled_from("abc")),
                    project=draw(st.sampled_from(["p", "q"])),
                    model=draw(st.sampled_from(["m", "n"])),
                    replica=draw(st.sampled_from(["m-1", "n-1"])),
                    status=draw(st.sampled_from([200, 200, 429])),
                    prompt_tokens=draw(st.integers(0, 9)),
                    completion_tokens=draw(st.integers(0, 9)),
                )
            )
        stream.append((seq, stored, records))
    return stream


@settings(max_examples=300, deadline=None)
@given(
    stream=streams(),
    runs=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12)), max_size=16),
    since_at=st.floats(0.0, 1.0),
    group_by=st.sampled_from(["model", "project", "key", "replica"]),
    bucket_s=st.sampled_from([0, USAGE_SLOT_S, 3600]),
    last=st.integers(0, 1),
)
def test_a_report_from_slots_equals_the_plain_sum_however_the_summing_ran(
    stream, runs, since_at, group_by, bucket_s, last
):
    """`runs`: which of two routers sums next and how many messages (2, 3: router 0, 1 restarted
    from the rolled mark, what it had summed in memory lost); after each, and once one of them
    (`last`) summed to the end, a report counts every request once."""
    bucket = Bucket()
    summers = [Summer(bucket, stream), Summer(bucket, stream)]
    end = stream[-1][1]
    since = T0 - 4000 + since_at * (end - T0 + 5000)
    query = UsageQuery(since=since, group_by=group_by, bucket_s=bucket_s)
    want = plain_sum(stream, query)
    for who, n in runs:
        if who >= 2:
            summers[who - 2] = Summer(bucket, stream)
        else:
            summers[who].step(n)
        assert report(bucket, stream, query, now=end) == want
    summers[last].step(len(stream))
    assert report(bucket, stream, query, now=end) == want


def test_a_slot_closes_at_the_first_request_past_it_and_its_grace():
    roller = Roller()
    r = UsageRecord(request_id="a", time=T0 + 10, key="k", project="p", model="m", completion_tokens=2)
    assert roller.feed(1, T0 + 10, [r]) == ([], [])
    just_inside = msgspec_replace(r, time=T0 + USAGE_SLOT_S + USAGE_SLOT_GRACE_S - 1)
    assert roller.feed(2, just_inside.time, [just_inside]) == ([], [])
    past = msgspec_replace(r, time=T0 + USAGE_SLOT_S + USAGE_SLOT_GRACE_S)
    late, [closed] = roller.feed(3, past.time, [past])
    assert not late and closed.start == T0
    assert [e.group for e in closed.entries] == list(GROUPS)  # one entry a group: a report reads one
    entry = closed.entries[GROUPS.index("key")]
    assert (entry.first, entry.upto, entry.sums["k"]) == (1, 3, [1, 0, 0, 0, 2])
    assert roller.rolled().resume == 2  # the slot of the second request is still open
    behind = msgspec_replace(r, time=T0 + 5)
    [late], closed = roller.feed(4, T0 + 400, [behind])
    assert (late.start, late.records, closed) == (T0, [(4, behind)], [])
    assert add_late(entry, late.records).upto == 4 and add_late(entry, late.records).sums["k"][0] == 2
    assert add_late(add_late(entry, late.records), late.records) is None  # added once


def test_a_request_stamped_far_off_the_stream_clock_counts_within_its_bounds():
    ahead = UsageRecord(request_id="a", time=T0 + 86400, key="k", project="p", model="m")
    assert at(ahead, T0) == T0 + USAGE_SLOT_GRACE_S
    behind = msgspec_replace(ahead, time=T0 - 30 * 86400)
    assert at(behind, T0) == T0 - USAGE_MOST_LATE_S
    roller = Roller()
    roller.feed(1, T0, [ahead])
    assert list(roller.open) == [slot_of(T0 + USAGE_SLOT_GRACE_S)]  # a day ahead would hold every slot open


def test_big_sums_are_split_over_parts_each_value_in_one():
    sums = {"key": {f"{i:016x}": [1, 0, 10, 0, 5] for i in range(12_000)}, "model": {"m": [12_000, 0, 0, 0, 0]}}
    entries = slot_parts(int(T0), 1, 9, sums, most=256 * 1024)
    [model] = [e for e in entries if e.group == "model"]
    keys = [e for e in entries if e.group == "key"]
    assert model.parts == 1 and len(keys) > 1 and all(p.parts == len(keys) for p in keys)
    assert sum(len(p.sums) for p in keys) == 12_000
    assert all(usage_part("key", k, len(keys)) == p.part for p in keys for k in p.sums)


def msgspec_replace(record: UsageRecord, **changes) -> UsageRecord:
    import msgspec

    return msgspec.structs.replace(record, **changes)
