"""The condition the claim loops wait on for room: whatever frees a slot or changes a limit
notifies it, and every loop waiting counts its room again."""

from __future__ import annotations

import asyncio


class Capacity:
    """Slots are counted where they are held (claims on their way in claiming, the prefetch,
    deliveries in flight, outcomes not yet reported); this is the signal that a count fell."""

    def __init__(self) -> None:
        self._condition = asyncio.Condition()
        self._notifying: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> None:
        await self._condition.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self._condition.release()

    async def wait(self) -> None:
        """Inside `async with capacity`: wait for the next notify()."""
        await self._condition.wait()

    async def notify(self) -> None:
        """Have every claim loop waiting for room count it again."""
        async with self._condition:
            self._condition.notify_all()

    def notify_soon(self) -> None:
        """notify(), from code that cannot wait for the condition: in a task of its own."""
        task = asyncio.ensure_future(self.notify())
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)
