"""One connection layer: sync and async connections and pools, LISTEN, and error mapping.

Everything that talks to PostgreSQL goes through here, so every driver error leaves as a
CourierError carrying its SQLSTATE.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

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
                 check: bool = False) -> None:
        """`configure` runs on each new connection of the pool (to register loaders, say). With
        `check`, a connection is tried (one round trip) before it is lent: one that died idle
        (a restart, pg_terminate_backend) is replaced rather than fail its borrower's call."""
        self.dsn = dsn
        self._application_name = application_name
        self._configure = configure
        self._pool = AsyncConnectionPool(
            _conninfo(dsn, application_name),
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True},
            configure=configure,
            check=AsyncConnectionPool.check_connection if check else None,
            open=False,
        )
        self._kept: psycopg.AsyncConnection | None = None
        self._kept_busy = False

    async def open(self, timeout: float = 10.0) -> AsyncDatabase:
        with translated():
            await self._pool.open(wait=True, timeout=timeout)
        return self

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
            async with self._pool.connection() as conn:
                yield conn

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
                    self._kept = await self._pool.getconn()
                conn = self._kept
                try:
                    yield conn
                finally:
                    if self._kept is conn and (
                            conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE):
                        self._kept = None
                        await self._pool.putconn(conn)
        finally:
            self._kept_busy = False

    @contextlib.asynccontextmanager
    async def listen(self, channel: str = NEW_MESSAGE_CHANNEL) -> AsyncIterator[AsyncIterator[str]]:
        """A dedicated connection LISTENing on channel (configured as the pool's are); yields an
        iterator of payloads."""
        conn = await connect_async(self.dsn, application_name=self._application_name)
        try:
            with translated():
                if self._configure is not None:
                    await self._configure(conn)
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

            async def payloads() -> AsyncIterator[str]:
                with translated():
                    async for notify in conn.notifies():
                        yield notify.payload

            yield payloads()
        finally:
            await conn.close()
