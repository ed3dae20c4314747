"""What every route shares: a connection pool per database role, the authenticator, the long
polls' wake-ups, and the topics' ids.

Each role's pool runs `SET ROLE courier_<role>` once on each new connection, so a request is
one round trip as the role of what it does (a function call in autocommit), not four (BEGIN,
SET LOCAL ROLE, the call, COMMIT): an HTTP enqueue measured 2.5x slower than the SQL path
that way. The server's own login (role None) only looks up tokens and topic ids.

While the database is away a request is answered 503 (with Retry-After) within
UNREACHABLE_SECONDS, and the first request after it is back is served: a pooled connection
that died idle is found before it is lent and replaced, and a connection that could not be
made is made again by the next request, not after the pool's reconnection backoff (which
grows to minutes)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import psycopg
from aiohttp import web
from psycopg import sql

from sqlkit import migrate, queries
from sqlkit.connection import AsyncDatabase, connect
from sqlkit.errors import CourierError, DatabaseUnavailable

from .auth import Authenticator
from .dequeues import DequeueGroups
from .enqueues import EnqueueGroups
from .problems import ApiError
from .sends import SendGroups
from .settles import SettleGroups
from .wakeups import TopicWakeups

TOPIC_IDS_SECONDS = 10.0
"""How long a topic's id is remembered for its long polls (a topic dropped and made again
gets a new id; until then its polls wake at their timeout)."""

POOL_SIZES: dict[str | None, tuple[int, int]] = {"application": (2, 16), "monitor": (0, 2), "admin": (0, 2),
                                                 None: (1, 2)}
"""(fewest, most) connections of each role's pool; the LISTEN connection is one more."""

UNREACHABLE_SECONDS = 1.0
"""How long a request waits for a pooled connection while every connection its pool tries to
make fails (the database is away, or refuses the role) before its 503; a pool that is only busy
keeps a request waiting its turn, as long as 30 s."""

READY_SECONDS = 2.0
"""How long /readyz waits for each pool's connection (a pool that lends none in 2 s, for
whatever reason, is not ready)."""

CHECK_AFTER_SECONDS = 1.0
"""A pooled connection idle this long is tried with a round trip before it is lent; one used more
recently only if its socket is readable (a session the server ended), so a busy server pays a
system call per request for the check, not a round trip."""

CONNECT_SECONDS = 2
"""libpq's connect_timeout for each pooled connection (2 s is the least libpq takes)."""


def role_pools(dsn: str) -> dict[str | None, AsyncDatabase]:
    def as_role(role: str) -> object:
        async def configure(conn: psycopg.AsyncConnection) -> None:
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"courier_{role}")))
        return configure

    return {role: AsyncDatabase(dsn, min_size=low, max_size=high, application_name="courier-serve",
                                configure=as_role(role) if role else None,  # type: ignore[arg-type]
                                check=True, check_after=CHECK_AFTER_SECONDS, unreachable_after=UNREACHABLE_SECONDS,
                                connect_timeout=CONNECT_SECONDS, reconnect_timeout=0)
            for role, (low, high) in POOL_SIZES.items()}


@dataclass
class Server:
    pools: dict[str | None, AsyncDatabase]
    auth: Authenticator
    wakeups: TopicWakeups
    _topic_ids: dict[str, tuple[int | None, float]] = field(default_factory=dict)
    closing: bool = False
    """Set at shutdown: long polls answer with what they have instead of waiting on."""
    enqueues: EnqueueGroups = field(init=False)
    """Single enqueues, written together when they arrive together."""
    settles: SettleGroups = field(init=False)
    """Single acks, nacks, snoozes and extends, written together when they arrive together."""
    dequeues: DequeueGroups = field(init=False)
    """Dequeues of a topic, written together when they arrive together."""
    sends: SendGroups = field(init=False)
    """Plain sends to a push endpoint, written together when they arrive together."""

    def __post_init__(self) -> None:
        self.enqueues = EnqueueGroups(lambda: self.session("application"))
        self.settles = SettleGroups(lambda: self.session("application"))
        self.dequeues = DequeueGroups(lambda: self.session("application"))
        self.sends = SendGroups(lambda: self.session("application"))

    KEY = web.AppKey("courier", object)

    @classmethod
    def of(cls, request: web.Request) -> Server:
        return request.app[cls.KEY]  # type: ignore[return-value]

    @property
    def dsn(self) -> str:
        return self.pools[None].dsn

    def session(self, role: str | None) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection]:
        """A connection as courier_<role> (None: the server's own login, for lookups), in
        autocommit: one statement is one transaction; use conn.transaction() for more. The
        pool's own context manager, not another wrapping it (one more per request, for nothing)."""
        return self.pools[role].connection()

    async def open(self) -> None:
        for pool in self.pools.values():
            await pool.open(timeout=30)

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()

    async def readiness(self) -> tuple[bool, str | None, str | None]:
        """Whether requests can be served: every role's pool lends a working connection as its
        role (a pool whose connections died, or whose SET ROLE is refused, fails the requests of
        that role however well a fresh connection does), and the schema is this Courier's. If
        not, a reason anyone may read (no address, no driver's words) and the error behind it,
        for the log. The pools are tried at once, so an outage answers within a second."""
        async def lends(role: str | None) -> None:
            try:
                async with asyncio.timeout(READY_SECONDS), self.session(role) as conn:
                    await conn.execute("SELECT 1")
            except TimeoutError:
                raise DatabaseUnavailable(f"no connection within {READY_SECONDS:g} s") from None

        tried = await asyncio.gather(*(lends(role) for role in self.pools), return_exceptions=True)
        for role, outcome in zip(self.pools, tried, strict=True):
            if isinstance(outcome, CourierError):
                return False, "database unreachable" + (f" as courier_{role}" if role else ""), outcome.one_line()
            if isinstance(outcome, BaseException):
                raise outcome

        def current() -> bool:
            with connect(self.dsn, connect_timeout=CONNECT_SECONDS) as conn:
                return migrate.status(conn).up_to_date

        try:
            if not await asyncio.to_thread(current):
                return False, "the schema needs `courier migrate`", None
        except CourierError as error:
            return False, "database unreachable", error.one_line()
        return True, None, None

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
