"""A message thread holds its conversation once: continued, it moves on to the new reply
and lets the one it continued go; what it never held, or let go, is not found."""

from __future__ import annotations

import pytest

from semantic.application.chat.message_threads import MessageThreads
from semantic.domain.errors import ObjectNotFoundError
from tests.unit.storage_fakes import FakeObjectStore


async def test_a_thread_moves_on_to_the_reply_that_continued_it() -> None:
    objects = FakeObjectStore()
    threads = MessageThreads(objects)
    await threads.hold("ns", "msg_1", '{"turns": 1}')
    await threads.hold("ns", "msg_2", '{"turns": 2}', moves_on="msg_1")
    assert await threads.held("ns", "msg_2") == '{"turns": 2}'
    assert len(objects.objects) == 1
    for gone in ("msg_1", "msg_never"):
        with pytest.raises(ObjectNotFoundError) as lost:
            await threads.held("ns", gone)
        assert lost.value.param == "thread.previous_message_id"
    with pytest.raises(ObjectNotFoundError):
        await threads.held("other", "msg_2")  # a namespace's threads are its own
