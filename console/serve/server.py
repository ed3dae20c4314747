"""What every route shares: the database pool, the authenticator, the long polls' wake-ups,
and a session that runs as the role of what the request does."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psycopg
from aiohttp import web

from sqlkit import queries
from sqlkit.connection import AsyncDatabase

from .auth import Authenticator
from .problems import ApiError
from .wakeups import TopicWakeups

TOPIC_IDS_SECONDS = 10.0
"""How long a topic's id is remembered for its long polls (a topic dropped and made again
gets a new id; until then its polls wake at their timeout)."""


@dataclass
class Server:
    db: AsyncDatabase
    auth: Authenticator
    wakeups: TopicWakeups
    _topic_ids: dict[str, tuple[int | None, float]] = field(default_factory=dict)
    closing: bool = False
    """Set at shutdown: long polls answer with what they have instead of waiting on."""

    KEY = web.AppKey("courier", object)

    @classmethod
    def of(cls, request: web.Request) -> Server:
        return request.app[cls.KEY]  # type: ignore[return-value]

    @contextlib.asynccontextmanager
    async def session(self, role: str | None) -> AsyncIterator[psycopg.AsyncConnection]:
        """A transaction run as courier_<role> (None: the server's own login, for lookups)."""
        async with self.db.connection() as conn, conn.transaction():
            if role is not None:
                await self.act_as(conn, role)
            yield conn

    @staticmethod
    async def act_as(conn: psycopg.AsyncConnection, role: str) -> None:
        """The rest of the session's transaction runs as courier_<role>."""
        await conn.execute(queries.query(f"as_{role}"))

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
