"""One connection layer: sync and async connections and pools, LISTEN, and error mapping.

Everything that talks to PostgreSQL goes through here, so every driver error leaves as a
CourierError carrying its SQLSTATE.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from .errors import translated

APPLICATION_NAME = "courier"
NEW_MESSAGE_CHANNEL = "courier_new_msg"


def _conninfo(dsn: str, application_name: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, application_name=application_name)


def connect(dsn: str, *, autocommit: bool = True, application_name: str = APPLICATION_NAME,
            connect_timeout: int = 10) -> psycopg.Connection:
    """Open one connection; autocommit unless the caller wants to group statements."""
    with translated():
        return psycopg.connect(
            _conninfo(dsn, application_name),
            autocommit=autocommit,
            connect_timeout=connect_timeout,
        )


async def connect_async(dsn: str, *, autocommit: bool = True,
                        application_name: str = APPLICATION_NAME) -> psycopg.AsyncConnection:
    with translated():
        return await psycopg.AsyncConnection.connect(
            _conninfo(dsn, application_name), autocommit=autocommit, connect_timeout=10
        )


class Unreachable(PoolTimeout):
    """No connection to lend: meanwhile connections failed to be made, and none was."""


class Database:
    """A pool of autocommit connections for code that runs many short operations."""

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 8,
                 application_name: str = APPLICATION_NAME, timeout: float = 30.0,
                 check_connections: bool = False) -> None:
        self.dsn = dsn
        self._pool = ConnectionPool(
            _conninfo(dsn, application_name),
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True, "connect_timeout": max(1, round(timeout))},
            timeout=timeout,
            # Checking costs a round trip per checkout, but a client that outlives server
            # restarts (the console) then never hands out a dead connection.
            check=ConnectionPool.check_connection if check_connections else None,
            open=False,
        )

    def open(self, timeout: float = 10.0, wait: bool = True) -> Database:
        """Open the pool; with wait=False it connects in the background and never fails here."""
        with translated():
            self._pool.open(wait=wait, timeout=timeout)
        return self

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Database:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with translated(), self._pool.connection() as conn:
            yield conn


class AsyncDatabase:
    """The asyncio twin of Database, plus LISTEN for new-message notifications."""

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 8,
                 application_name: str = APPLICATION_NAME,
                 configure: Callable[[psycopg.AsyncConnection], Awaitable[None]] | None = None,
                 check: bool = False, check_after: float = 0.0, timeout: float = 30.0,
                 unreachable_after: float | None = None, connect_timeout: int | None = None,
                 reconnect_timeout: float = 300.0) -> None:
        """`configure` runs on each new connection of the pool (to register loaders, say).

        With `check`, a connection is tried (one round trip) before it is lent: one that died
        idle (a restart, pg_terminate_backend, a failover) is replaced rather than fail its
        borrower's call, and the next is tried at once. A connection given back less than
        `check_after` seconds ago is tried only if its socket has something to read, which costs
        a system call instead of a round trip: a server that ends a session sends its FATAL and
        closes, so such a connection is readable and a healthy idle one is not. (Only the round
        trip finds a connection whose end went silently, past a proxy or a moved address; one
        that goes so within check_after of its last use fails its next borrower.)

        `timeout` is how long a borrower waits for a connection before a DatabaseUnavailable.
        With `unreachable_after`, one that has waited that long while connections failed to be
        made (to connect, or in `configure`) and none was made gets it then: a pool that cannot
        connect says so in a second, while one that is only busy keeps its borrowers waiting
        their turn. `connect_timeout` is libpq's, for each new connection (None:
        libpq's default, none).
        A connection that cannot be made is tried again in the background, backing off from 1 s
        and doubling, for `reconnect_timeout` seconds once the pool is open; 0 gives up at once
        and leaves the next borrower to connect afresh, so a database that comes back after a
        long outage serves the next borrower, not the one after the next backoff."""
        self.dsn = dsn
        self._application_name = application_name
        self._configure = configure
        self._check = check
        self._check_after = check_after
        self._given_back: weakref.WeakKeyDictionary[psycopg.AsyncConnection, float] = weakref.WeakKeyDictionary()
        self._timeout = timeout
        self._unreachable_after = unreachable_after
        self._connects = [0, 0]  # connections made, and failed to be made
        self._reconnect_timeout = reconnect_timeout
        self._pool = AsyncConnectionPool(
            _conninfo(dsn, application_name),
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True,
                    **({"connect_timeout": connect_timeout} if connect_timeout is not None else {})},
            configure=self._configured,
            timeout=timeout,
            open=False,
        )
        self._kept: psycopg.AsyncConnection | None = None
        self._kept_busy = False

    async def open(self, timeout: float = 10.0) -> AsyncDatabase:
        with translated():
            await self._pool.open(wait=True, timeout=timeout)
        # While opening, the pool keeps trying for as long as it always did (a database that
        # comes up while the caller waits is used); from here on, for reconnect_timeout.
        self._pool.reconnect_timeout = self._reconnect_timeout
        return self

    async def _configured(self, conn: psycopg.AsyncConnection) -> None:
        """The pool's configure: the caller's, and a count of what connected and what failed."""
        try:
            if self._configure is not None:
                await self._configure(conn)
        except BaseException:
            self._connects[1] += 1
            raise
        self._connects[0] += 1

    def _attempts(self) -> tuple[int, int]:
        """Connections the pool made, and connections it failed to make (to connect, or to
        configure), so far."""
        return self._connects[0], self._pool.get_stats().get("connections_errors", 0) + self._connects[1]

    async def _getconn(self, timeout: float) -> psycopg.AsyncConnection:
        """The pool's getconn(), given up early as `unreachable_after` says: waited for in turns
        of that long (a borrower still waiting after one goes to the back of the line)."""
        if self._unreachable_after is None:
            return await self._pool.getconn(timeout=timeout)
        made, failed = self._attempts()
        began = time.monotonic()
        deadline = began + timeout
        while True:
            turn = min(self._unreachable_after, deadline - time.monotonic())
            try:
                return await self._pool.getconn(timeout=max(turn, 0.001))
            except PoolTimeout:
                made_now, failed_now = self._attempts()
                if failed_now > failed and made_now == made:
                    raise Unreachable(f"couldn't get a connection after {time.monotonic() - began:.2f} sec, "
                                      "and every connection attempt meanwhile failed") from None
                if time.monotonic() >= deadline:
                    raise

    async def _lend(self) -> psycopg.AsyncConnection:
        """A connection from the pool, checked as `check` says. One that fails its check goes
        back (the pool closes it and connects another) and the next is tried with no pause:
        after a restart every idle connection is dead, and each is found so at once, where
        psycopg_pool's own check waits 1 s, then 2 s, ... before trying the next."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                conn = await self._getconn(max(deadline - time.monotonic(), 0.001))
            except Unreachable:
                raise
            except PoolTimeout:
                raise PoolTimeout(f"couldn't get a connection after {self._timeout:.2f} sec") from None
            if not self._check or (time.monotonic() - self._given_back.get(conn, -math.inf) < self._check_after
                                   and not _readable(conn)):
                return conn
            try:
                await AsyncConnectionPool.check_connection(conn)
            except Exception:
                await conn.close()  # so the pool replaces it, whatever the check found
                await self._pool.putconn(conn)
                continue
            except BaseException:
                await self._pool.putconn(conn)
                raise
            return conn

    async def close(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            await self._pool.putconn(kept)
        await self._pool.close()

    async def __aenter__(self) -> AsyncDatabase:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        with translated():
            conn = await self._lend()
            try:
                yield conn
            finally:
                await self._give_back(conn)

    async def _give_back(self, conn: psycopg.AsyncConnection) -> None:
        if self._check_after:
            self._given_back[conn] = time.monotonic()
        await self._pool.putconn(conn)

    @contextlib.asynccontextmanager
    async def kept_connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """One of the pool's connections, kept out of it between calls: borrowing one from
        psycopg_pool and giving it back was a tenth of a pull consumer's Python at 10 messages
        per batch. One caller at a time; a caller that finds it in use borrows from the pool.
        It goes back to the pool when it broke or was left in a transaction, and on close()."""
        if self._kept_busy:
            async with self.connection() as conn:
                yield conn
            return
        self._kept_busy = True
        try:
            with translated():
                if self._kept is None:
                    self._kept = await self._lend()
                conn = self._kept
                try:
                    yield conn
                finally:
                    if self._kept is conn and (
                            conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE):
                        self._kept = None
                        await self._give_back(conn)
        finally:
            self._kept_busy = False

    async def dedicated(self) -> psycopg.AsyncConnection:
        """A connection of the caller's own, outside the pool, configured as the pool's are;
        the caller closes it."""
        conn = await connect_async(self.dsn, application_name=self._application_name)
        try:
            with translated():
                if self._configure is not None:
                    await self._configure(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    @contextlib.asynccontextmanager
    async def listen(self, channel: str = NEW_MESSAGE_CHANNEL) -> AsyncIterator[AsyncIterator[str]]:
        """A dedicated connection LISTENing on channel (configured as the pool's are); yields an
        iterator of payloads.

        The payloads are read straight off libpq whenever the socket is readable, every
        notification that arrived together at once, rather than through psycopg's notifies(),
        which arms and disarms its wait on the socket for every read: with a commit's NOTIFY
        arriving every millisecond or so, that cost each worker pool 216 us of CPU a
        notification against 144 us (two pools both receive every one). The socket stays
        registered, so the iterator is for a task that does nothing but drain it (as every
        caller's does): notifications left waiting on the socket wake the event loop on each of
        its turns until they are read."""
        conn = await self.dedicated()
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        watched: int | None = None
        try:
            with translated():
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            encoding = conn.info.encoding
            watched = conn.pgconn.socket
            loop.add_reader(watched, readable.set)
            readable.set()  # what arrived with LISTEN's own answer is read first

            async def payloads() -> AsyncIterator[str]:
                with translated():
                    while True:
                        await readable.wait()
                        readable.clear()
                        conn.pgconn.consume_input()  # raises once the server has closed the session
                        if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                            raise psycopg.OperationalError("the LISTEN connection was lost")
                        while (notify := conn.pgconn.notifies()) is not None:
                            yield notify.extra.decode(encoding)

            yield payloads()
        finally:
            # Before the close: the socket's number may be reused at once by another connection.
            if watched is not None:
                loop.remove_reader(watched)
            await conn.close()


def _readable(conn: psycopg.AsyncConnection) -> bool:
    """Whether an idle connection's socket has something to read: nothing, while the server
    keeps the session; a FATAL and the close, once it ended it. True where it cannot tell."""
    if conn.closed or not hasattr(select, "poll"):
        return True
    try:
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True
