"""Long polls: one LISTEN connection for the server, and an event per topic that a NOTIFY for
it sets. A poll arms its topic's event before it dequeues, so a message enqueued between an
empty dequeue and the wait still wakes it."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlkit.connection import AsyncDatabase
from sqlkit.errors import CourierError

log = logging.getLogger("courier.serve")


class TopicWakeups:
    def __init__(self, db: AsyncDatabase) -> None:
        self._db = db
        self._events: dict[int, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="listen")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._wake_all()

    def armed(self, topic_id: int) -> asyncio.Event:
        """The event the next NOTIFY for the topic sets (shared by every poll of it)."""
        return self._events.setdefault(topic_id, asyncio.Event())

    async def _listen(self) -> None:
        while True:
            try:
                async with self._db.listen() as notifications:
                    self._wake_all()  # anything sent while nobody listened
                    async for payload in notifications:
                        if payload.isdigit():
                            event = self._events.pop(int(payload), None)
                            if event is not None:
                                event.set()
                        else:
                            self._wake_all()
            except CourierError as error:
                log.warning("LISTEN connection lost; reconnecting", extra={"error": error.one_line()})
                self._wake_all()
                await asyncio.sleep(1.0)

    def _wake_all(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()
