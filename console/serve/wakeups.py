"""Long polls: one LISTEN connection for the server, and per topic a line of waiting polls.

A NOTIFY for a topic wakes the first poll in line, not all of them: 200 polls waiting on a
topic cost one dequeue per message, not 200. A woken poll that took a full batch wakes two
more (the topic may hold more, and a batch enqueued in one transaction sends one NOTIFY),
so a burst reaches the waiting polls in a few rounds. A woken poll never drops its wake-up:
if it leaves before a dequeue that began after the wake-up (it timed out, its client went
away, the server is stopping), or the wake-up came while it was dequeuing, it wakes the next
in line. A poll joins the line before it dequeues, so a message enqueued between an empty
dequeue and the wait still wakes it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from sqlkit.connection import AsyncDatabase
from sqlkit.errors import CourierError

log = logging.getLogger("courier.serve")

FULL_BATCH_WAKES = 2
"""Polls a woken poll that took a full batch wakes in turn."""


class TopicWakeups:
    def __init__(self, db: AsyncDatabase) -> None:
        self._db = db
        self._lines: dict[int, deque[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.woken_total = 0
        """Polls woken so far, for /metrics."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="listen")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._wake_all()

    @property
    def waiting(self) -> int:
        return sum(1 for line in self._lines.values() for waiter in line if not waiter.done())

    def join(self, topic_id: int) -> asyncio.Future[None]:
        """A place at the end of the topic's line; it is done when the poll is woken."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lines.setdefault(topic_id, deque()).append(waiter)
        return waiter

    def leave(self, topic_id: int, waiter: asyncio.Future[None]) -> None:
        line = self._lines.get(topic_id)
        if line is not None:
            with contextlib.suppress(ValueError):
                line.remove(waiter)
            if not line:
                del self._lines[topic_id]

    def wake(self, topic_id: int, polls: int = 1) -> None:
        """Wake the first `polls` polls in the topic's line."""
        line = self._lines.get(topic_id)
        while line and polls > 0:
            waiter = line.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self.woken_total += 1
                polls -= 1
        if line is not None and not line:
            del self._lines[topic_id]

    async def _listen(self) -> None:
        while True:
            try:
                async with self._db.listen() as notifications:
                    self._wake_all()  # anything sent while nobody listened
                    async for payload in notifications:
                        if payload.isdigit():
                            self.wake(int(payload))
                        else:
                            self._wake_all()
            except CourierError as error:
                log.warning("LISTEN connection lost; reconnecting", extra={"error": error.one_line()})
                self._wake_all()
                await asyncio.sleep(1.0)

    def _wake_all(self) -> None:
        for topic_id in list(self._lines):
            self.wake(topic_id, len(self._lines.get(topic_id, ())))
