"""The answer cache's kept answers on a real NATS: the index follows the bucket's changes key by
key (not every answer again at each change), and answers past their policy's time are deleted."""

from __future__ import annotations

import asyncio
import time

import msgspec
import numpy as np

from llmgw.proto.knowledge import AnswerCache, CachedAnswer
from llmgw.router.knowledge.answers import Answers

POLICY = AnswerCache(tenant="lab", model="chat", embedding="mini", ttl_s=60)


class _Walks(dict):
    """A dict that counts how often all of it is read."""

    walks = 0

    def items(self):
        type(self).walks += 1
        return super().items()

    def keys(self):
        type(self).walks += 1
        return super().keys()

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return v / np.linalg.norm(v)


def _answer(text: str, at: float) -> CachedAnswer:
    return CachedAnswer(question="", embedded_with="", vector=b"", content=text, time=at)


async def _answers(nc) -> Answers:
    answers = await Answers.open(nc.jetstream(), nc, lambda _: None)
    answers.model_version = lambda name: "mini@1" if name == "mini" else None
    await answers.policies.kv.put("lab.chat", msgspec.json.encode(POLICY))  # as `put` keeps it
    for _ in range(200):
        if answers.kept.synced and "lab.chat" in answers.policies.items:
            break
        await asyncio.sleep(0.02)
    return answers


async def _until(check) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never")


async def test_the_index_takes_each_change_without_reading_every_answer_again(nc):
    answers = await _answers(nc)
    try:
        now = time.time()
        for i in range(20):
            await answers.keep(POLICY, f"question {i}", _vector(i), "v", _answer(f"answer {i}", now))
        await _until(lambda: len(answers.kept.items) == 20)
        assert answers.lookup(POLICY, _vector(3), "v")[0].content == "answer 3"  # the first look reads them all
        answers.kept.items = _Walks(answers.kept.items)
        await answers.keep(POLICY, "question 20", _vector(20), "v", _answer("answer 20", now))
        await _until(lambda: "answer 20" in {a.content for a in answers.kept.items.values()})
        _Walks.walks = 0
        assert answers.lookup(POLICY, _vector(20), "v")[0].content == "answer 20"
        assert _Walks.walks == 0  # the one answer that changed, not the twenty-one
        gone = next(k for k, a in answers.kept.items.items() if a.content == "answer 3")
        await answers.kept.kv.delete(gone)  # another router's purge
        await _until(lambda: gone not in answers.kept.items)
        found = answers.lookup(POLICY, _vector(3), "v")
        assert found is None or found[0].content != "answer 3"
        assert gone not in answers.loaded and len(answers.loaded) == 20  # out of the index too
    finally:
        answers.stop()


async def test_answers_past_their_policys_time_are_deleted_and_the_rest_kept(nc):
    answers = await _answers(nc)
    try:
        now = time.time()
        await answers.keep(POLICY, "old", _vector(1), "v", _answer("old", now - 61))
        await answers.keep(POLICY, "new", _vector(2), "v", _answer("new", now - 59))
        await _until(lambda: len(answers.kept.items) == 2)
        assert await answers.sweep(now) == 1
        await _until(lambda: [a.content for a in answers.kept.items.values()] == ["new"])
        assert [e.key async for e in _keys(answers)] == [k for k in answers.kept.items]
        # an answer kept again after this router last heard of it stays: the bucket's is what counts
        key = next(iter(answers.kept.items))
        answers.kept.items[key] = _answer("new", now - 61)  # as a lagging view would have it
        assert await answers.sweep(now) == 0
        assert (await answers.kept.kv.get(key)).value
    finally:
        answers.stop()


async def _keys(answers: Answers):
    for key in await answers.kept.kv.keys():
        yield await answers.kept.kv.get(key)
