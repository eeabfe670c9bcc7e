"""The usage stream read back in pulls: each pull's answer is told apart from the last one's."""

from llmgw.router.usage.stream_reader import StreamReader

STREAM = "reader_test"


async def test_a_pull_is_not_ended_by_the_note_that_closes_the_pull_before_it(nc):
    """A pull filled exactly is followed by NATS's `409 Batch Completed`; read late, that note
    once ended the next pull empty, as if its consumer were gone (seen in CI)."""
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=[STREAM])
    for i in range(400):
        await js.publish(STREAM, str(i).encode())
    for _ in range(20):
        reader = await StreamReader(nc, js, STREAM).open()
        seen = []
        while batch := await reader.pull(5):
            seen += [int(data) for _, _, data in batch]
        await reader.close()
        assert seen == list(range(400))
