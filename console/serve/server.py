"""What every route shares: a connection pool per database role, the authenticator, the long
polls' wake-ups, and the topics' ids.

Each role's pool runs `SET ROLE courier_<role>` once on each new connection, so a request is
one round trip as the role of what it does (a function call in autocommit), not four (BEGIN,
SET LOCAL ROLE, the call, COMMIT): an HTTP enqueue measured 2.5x slower than the SQL path
that way. The server's own login (role None) only looks up tokens and topic ids."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psycopg
from aiohttp import web
from psycopg import sql

from sqlkit import queries
from sqlkit.connection import AsyncDatabase

from .auth import Authenticator
from .problems import ApiError
from .wakeups import TopicWakeups

TOPIC_IDS_SECONDS = 10.0
"""How long a topic's id is remembered for its long polls (a topic dropped and made again
gets a new id; until then its polls wake at their timeout)."""

POOL_SIZES: dict[str | None, tuple[int, int]] = {"application": (2, 16), "monitor": (0, 2), "admin": (0, 2),
                                                 None: (1, 2)}
"""(fewest, most) connections of each role's pool; the LISTEN connection is one more."""


def role_pools(dsn: str) -> dict[str | None, AsyncDatabase]:
    def as_role(role: str) -> object:
        async def configure(conn: psycopg.AsyncConnection) -> None:
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"courier_{role}")))
        return configure

    return {role: AsyncDatabase(dsn, min_size=low, max_size=high, application_name="courier-serve",
                                configure=as_role(role) if role else None)  # type: ignore[arg-type]
            for role, (low, high) in POOL_SIZES.items()}


@dataclass
class Server:
    pools: dict[str | None, AsyncDatabase]
    auth: Authenticator
    wakeups: TopicWakeups
    _topic_ids: dict[str, tuple[int | None, float]] = field(default_factory=dict)
    closing: bool = False
    """Set at shutdown: long polls answer with what they have instead of waiting on."""

    KEY = web.AppKey("courier", object)

    @classmethod
    def of(cls, request: web.Request) -> Server:
        return request.app[cls.KEY]  # type: ignore[return-value]

    @property
    def dsn(self) -> str:
        return self.pools[None].dsn

    @contextlib.asynccontextmanager
    async def session(self, role: str | None) -> AsyncIterator[psycopg.AsyncConnection]:
        """A connection as courier_<role> (None: the server's own login, for lookups), in
        autocommit: one statement is one transaction; use conn.transaction() for more."""
        async with self.pools[role].connection() as conn:
            yield conn

    async def open(self) -> None:
        for pool in self.pools.values():
            await pool.open(timeout=30)

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()

    async def topic_id(self, topic: str) -> int:
        found = await self.find_topic(topic)
        if found is None:
            raise ApiError(404, "not_found", f"topic {topic!r} does not exist")
        return found

    async def find_topic(self, name: str) -> int | None:
        """The id of pull topic `name`, or None if no pull topic has that name."""
        known, until = self._topic_ids.get(name, (None, 0.0))
        if until > time.monotonic():
            return known
        async with self.session(None) as conn:
            found = await queries.fetch_value_async(conn, "topic_id", {"topic": name})
        self._topic_ids[name] = (found, time.monotonic() + TOPIC_IDS_SECONDS)
        return found
