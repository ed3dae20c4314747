"""Long polls: one LISTEN connection for the server, and per topic a line of waiting polls.

A NOTIFY for a topic wakes the first poll in line, not all of them: 200 polls waiting on a
topic cost one dequeue per message, not 200. A woken poll that took a full batch wakes two
more (the topic may hold more, and a batch enqueued in one transaction sends one NOTIFY),
so a burst reaches the waiting polls in a few rounds. A woken poll never drops its wake-up:
if it leaves before a dequeue that began after the wake-up (it timed out, its client went
away, the server is stopping), or the wake-up came while it was dequeuing, it wakes the next
in line. A poll joins the line before it dequeues, so a message enqueued between an empty
dequeue and the wait still wakes it.

The server LISTENs only while polls wait: with none, every producer's NOTIFY would still
reach it, and handling them cost 6% of the server's CPU under an enqueue load (issue 40). The
first poll after a quiet spell waits for the LISTEN to be in place before it dequeues (the
same guarantee as above), and the connection is closed once no poll has waited for
IDLE_SECONDS.

Of the producers committing to a topic together only one NOTIFYs (sqlkit/linger.py); the
others become visible a little later. So after a NOTIFY, while polls wait on the topic, the
topic lingers: it asks courier.sends_committing until no producer of it is committing any
more, then wakes one more poll to look. A poll that comes back empty shortly after a NOTIFY
starts that linger too, since it may have looked before those producers' commits were visible."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator

from sqlkit import queries
from sqlkit.connection import AsyncDatabase
from sqlkit.errors import CourierError
from sqlkit.linger import LIMIT as LINGER_LIMIT
from sqlkit.linger import Linger

log = logging.getLogger("courier.serve")

FULL_BATCH_WAKES = 2
"""Polls a woken poll that took a full batch wakes in turn."""
IDLE_SECONDS = 10.0
"""How long the LISTEN connection stays after the last waiting poll left."""
IDLE_CHECK_SECONDS = 1.0


class TopicWakeups:
    def __init__(self, db: AsyncDatabase) -> None:
        self._db = db
        self._lines: dict[int, deque[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._notified_at: dict[int, float] = {}
        self._lingering: dict[int, tuple[Linger, asyncio.Task[None]]] = {}
        self.woken_total = 0
        """Polls woken so far, for /metrics."""
        self._wanted = asyncio.Event()
        """Set while polls wait (or have waited within IDLE_SECONDS): LISTEN."""
        self._listening = asyncio.Event()
        self._listening_since = -LINGER_LIMIT
        """When the LISTEN last began (the loop's clock)."""
        self._lingered_since_listen: set[int] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="listen")

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    async def until_listening(self, timeout: float) -> None:
        """Wait (at most `timeout`) until notifications reach the lines: a dequeue made after
        that cannot miss the NOTIFY of a message enqueued after it."""
        if not self._listening.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._listening.wait(), timeout)

    async def stop(self) -> None:
        tasks = [task for task in (self._task, *(task for _, task in self._lingering.values())) if task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._wake_all()

    @property
    def waiting(self) -> int:
        return sum(1 for line in self._lines.values() for waiter in line if not waiter.done())

    def join(self, topic_id: int) -> asyncio.Future[None]:
        """A place at the end of the topic's line; it is done when the poll is woken."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lines.setdefault(topic_id, deque()).append(waiter)
        self._wanted.set()
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

    def came_back_empty(self, topic_id: int) -> None:
        """A poll's first dequeue found nothing. If the topic was notified within a linger's
        length, producers that left their NOTIFY to another may still be committing: linger,
        and wake a poll to look once they are done."""
        now = asyncio.get_running_loop().time()
        notified_at = self._notified_at.get(topic_id)
        notified = notified_at is not None and now - notified_at < LINGER_LIMIT
        # A NOTIFY sent before the LISTEN began was missed: a LISTEN that began within a
        # linger's length counts as a NOTIFY just then, once per topic.
        listened = now - self._listening_since < LINGER_LIMIT and topic_id not in self._lingered_since_listen
        if topic_id not in self._lingering and (notified or listened):
            self._lingered_since_listen.add(topic_id)
            self._start_linger(topic_id, owed=False)

    def _notified(self, topic_id: int) -> None:
        self._notified_at[topic_id] = asyncio.get_running_loop().time()
        if not self._lines.get(topic_id):
            return
        if topic_id in self._lingering:  # it wakes a poll once more when the commits are done
            self.wake(topic_id)
            self._lingering[topic_id][0].start()
        else:
            self._start_linger(topic_id, owed=True)

    def _start_linger(self, topic_id: int, owed: bool) -> None:
        linger = Linger()
        linger.start()
        task = asyncio.create_task(self._lingered(topic_id, linger, owed), name=f"linger-{topic_id}")
        self._lingering[topic_id] = (linger, task)

    async def _lingered(self, topic_id: int, linger: Linger, owed: bool) -> None:
        """Ask whether producers of the topic are committing until none is, then wake a poll.
        `owed` is a NOTIFY's wake-up, given after the first answer: if that says no producer is
        committing, the poll it wakes sees every commit, and no second wake-up is needed."""
        try:
            while self._lines.get(topic_id):
                async with self._db.connection() as conn:
                    committing = await queries.fetch_value_async(conn, "sends_committing", {"endpoint_id": topic_id})
                pause = linger.next_pause(bool(committing))
                if owed or linger.final:
                    self.wake(topic_id)
                    owed = False
                    if linger.final:
                        return
                if pause is None:
                    return
                await asyncio.sleep(pause)
        except CourierError as error:  # the polls still wake at the next NOTIFY, or time out
            log.info("linger check failed", extra={"topic_id": topic_id, "error": error.one_line()})
        finally:
            if owed:
                self.wake(topic_id)
            self._lingering.pop(topic_id, None)

    async def _listen(self) -> None:
        lost = False  # polls that joined while nobody listened wait for the LISTEN before they dequeue
        while True:
            await self._wanted.wait()
            try:
                async with self._db.listen() as notifications:
                    self._listening.set()
                    self._listening_since = asyncio.get_running_loop().time()
                    self._lingered_since_listen.clear()
                    if lost:  # polls waited through the gap: anything may have been sent meanwhile
                        self._wake_all()
                        lost = False
                    consumer = asyncio.create_task(self._consume(notifications), name="notifications")
                    try:
                        await self._until_idle(consumer)
                    finally:
                        consumer.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await consumer
            except CourierError as error:
                log.warning("LISTEN connection lost; reconnecting", extra={"error": error.one_line()})
                self._listening.clear()
                self._wake_all()
                lost = True
                await asyncio.sleep(1.0)
            finally:
                self._listening.clear()

    async def _consume(self, notifications: AsyncIterator[str]) -> None:
        async for payload in notifications:
            if payload.isdigit():
                self._notified(int(payload))
            else:
                self._wake_all()

    async def _until_idle(self, consumer: asyncio.Task[None]) -> None:
        """Return once no poll has waited for IDLE_SECONDS (and no poll is joining: the event
        is cleared in the same step); raise what ended the consumer, if it ended."""
        loop = asyncio.get_running_loop()
        idle_since: float | None = None
        while True:
            done, _ = await asyncio.wait({consumer}, timeout=IDLE_CHECK_SECONDS)
            if done:
                consumer.result()
                return
            if self.waiting or self._lingering:
                idle_since = None
            elif idle_since is None:
                idle_since = loop.time()
            elif loop.time() - idle_since >= IDLE_SECONDS:
                self._wanted.clear()
                return

    def _wake_all(self) -> None:
        for topic_id in list(self._lines):
            self.wake(topic_id, len(self._lines.get(topic_id, ())))
