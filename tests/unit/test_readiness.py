"""Readiness: an instance says it cannot take turns while its disk refuses them or a store
it writes to does not answer, and says so again once they are back."""

from __future__ import annotations

import asyncio

from semantic.application.cache.disk_room import DiskState
from semantic.application.readiness import ReadinessCheck
from semantic.domain.errors import StorageUnavailableError

ROOMY = DiskState(free_bytes=1 << 30, refused=None)
FULL = DiskState(free_bytes=0, refused="the disk holding /data is full")


class FakeProbe:
    def __init__(self) -> None:
        self.down: str | None = None
        self.hangs = False

    async def ping(self) -> None:
        if self.hangs:
            await asyncio.Event().wait()
        if self.down is not None:
            raise StorageUnavailableError(self.down)


async def test_ready_while_the_disk_has_room_and_the_stores_answer() -> None:
    check = ReadinessCheck(lambda: ROOMY, {"metadata": FakeProbe()})
    assert (await check.check()).ready


async def test_a_disk_that_refuses_turns_is_not_ready_until_it_has_room() -> None:
    disk = [FULL]
    check = ReadinessCheck(lambda: disk[0], {"metadata": FakeProbe()})
    refused = await check.check()
    assert not refused.ready
    assert refused.reasons == ("storage: the disk holding /data is full",)
    disk[0] = ROOMY
    assert (await check.check()).ready


async def test_a_store_that_fails_or_does_not_answer_is_named() -> None:
    probe = FakeProbe()
    check = ReadinessCheck(lambda: ROOMY, {"metadata": probe}, timeout_s=0.01)
    probe.down = "the metadata database cannot be reached"
    assert (await check.check()).reasons == ("metadata: the metadata database cannot be reached",)
    probe.down, probe.hangs = None, True
    assert (await check.check()).reasons == ("metadata: no answer in 0.01 s",)
    probe.hangs = False
    assert (await check.check()).ready
