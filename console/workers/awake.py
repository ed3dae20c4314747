"""The wake lock an awake claim loop holds, so that producers committing meanwhile skip their
NOTIFY.

Of the producers committing together to an endpoint, the one that takes the endpoint's wake
lock NOTIFYs (see the top of sqlkit/functions/sending.sql). A NOTIFY holds a cluster-wide lock
through its commit's WAL flush, and every pool's LISTEN connection receives it: with 16
producers and the worker draining, about one commit in twelve sent one, and without them the
same producers committed a third more sends a second (BENCHMARKS.md, "The sends while a worker
drains them"). While an endpoint's claim loop claims back to back it needs no wake-up, so
after its second claim in a row that found messages it holds the lock itself, on a connection
of its own, and producers' tries fail as if another producer held it. Before the loop waits
it lets go and looks once more, asking whether producers are committing first (the linger):
a producer that skipped its NOTIFY while the lock was held holds its sends_committing lock
until its commit is visible, so that look, or the linger's next, sees its message.

Anything that goes wrong with the connection lets go of every lock it held (the server drops
a session's advisory locks with it), and the loops that held one look once more.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from sqlkit import queries
from sqlkit.connection import AsyncDatabase

from .faults import one_line
from .settings import PoolStats

log = logging.getLogger("courier.worker")


class WakeHold:
    def __init__(self, db: AsyncDatabase, stats: PoolStats) -> None:
        self._db = db
        self._stats = stats
        self._conn: psycopg.AsyncConnection | None = None
        self._held: set[int] = set()
        # Held on a connection that failed and was closed: their loops still look once more.
        self._lost: set[int] = set()
        self._turn = asyncio.Lock()  # one statement at a time on the connection

    def holds(self, endpoint_id: int) -> bool:
        return endpoint_id in self._held

    async def hold(self, endpoint_id: int) -> None:
        """Take the endpoint's wake lock if it is free. Never waits on it: a producer's commit
        holds it for an instant, and the next claim tries again."""
        if endpoint_id in self._held:
            return
        async with self._turn:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await self._db.dedicated()
                self._stats.round_trips += 1
                if await queries.fetch_value_async(self._conn, "hold_wake_lock", {"endpoint_id": endpoint_id}):
                    self._held.add(endpoint_id)
            except Exception as error:  # producers go on waking the loop, as without it
                log.info("wake lock not taken", extra={"endpoint_id": endpoint_id, "error": one_line(error)})
                await self._close()

    async def release(self, endpoint_id: int) -> bool:
        """Let go of the endpoint's wake lock; True if it was held, and so the loop must look
        once more (asking first) before it waits."""
        if endpoint_id in self._lost:
            self._lost.discard(endpoint_id)
            return True
        if endpoint_id not in self._held:
            return False
        self._held.discard(endpoint_id)
        async with self._turn:
            try:
                if self._conn is not None and not self._conn.closed:
                    self._stats.round_trips += 1
                    await queries.fetch_value_async(self._conn, "release_wake_lock", {"endpoint_id": endpoint_id})
            except Exception as error:  # closing the session lets go of it too
                log.info("wake lock release failed", extra={"endpoint_id": endpoint_id, "error": one_line(error)})
                await self._close()
        return True

    async def close(self) -> None:
        async with self._turn:
            await self._close()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        self._lost |= self._held
        self._held.clear()
        if conn is not None:
            try:
                await conn.close()
            except Exception as error:  # closing anyway: the server drops the session's locks
                log.debug("wake lock connection close failed", extra={"error": one_line(error)})
