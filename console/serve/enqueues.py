"""Single enqueues that arrive together are written together, as PostgreSQL's group commit
writes commits together.

Each `POST /api/messages` still answers only once its message is committed, with its own id.
While a topic's write is in the database, the enqueues that arrive for that topic wait in line,
and the next write takes the whole line as one `courier.enqueue_batch` call: one statement, one
counter write, one wake-up and one commit for the lot, where each message alone cost a call of
`courier.enqueue` and a commit (about 650,000 instructions of the database's CPU each, against
about 60,000 a message in a batch). A lone enqueue is written at once, as before: nothing waits
on a timer, so an idle server adds no latency, and a busy one batches in proportion to its load.

A batch is all or nothing, but one bad message must fail alone: when a batch is refused (a
message over max_payload_size, a topic at max_depth with room for some), each of its messages is
written again on its own, and each request gets its own answer. Only an unreachable database
fails the whole line at once, as it would have failed each request. A keyed message (it may
replace another) is always written on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from sqlkit import queries
from sqlkit.errors import CourierError, DatabaseUnavailable

MAX_GROUP = 500
"""The most enqueues one write takes; the rest wait for the next."""
WRITERS = 1
"""Writes in flight per topic. One makes the largest groups: under 16 closed-loop clients it
answered 5,571-5,591 enqueues a second against 4,848-5,280 with two (BENCHMARKS.md)."""

Session = Callable[[], Any]
"""An async context manager lending a connection in autocommit (Server.session("application"))."""


@dataclass
class _Line:
    waiting: list[tuple[dict[str, Any], asyncio.Future[int]]] = field(default_factory=list)
    writers: int = 0


@dataclass
class EnqueueGroups:
    session: Session
    _lines: dict[str, _Line] = field(default_factory=dict)
    _writers: set[asyncio.Task[None]] = field(default_factory=set)

    async def enqueue(self, params: dict[str, Any]) -> int:
        """The id of the message `params` (pull_enqueue's parameters) describes, once committed."""
        if params["key"] is not None:
            return await self._one(params)
        line = self._lines.setdefault(params["topic"], _Line())
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        line.waiting.append((params, done))
        if line.writers < WRITERS:
            line.writers += 1
            writer = asyncio.create_task(self._write(params["topic"], line))
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        return await done

    async def _write(self, topic: str, line: _Line) -> None:
        group: list[tuple[dict[str, Any], asyncio.Future[int]]] = []
        try:
            while line.waiting:
                group, line.waiting = line.waiting[:MAX_GROUP], line.waiting[MAX_GROUP:]
                await self._write_group(group)
        except BaseException as error:  # no request is left waiting for an answer that never comes
            cancelled = isinstance(error, asyncio.CancelledError)
            stopped = DatabaseUnavailable("the server is stopping") if cancelled else error
            for _, done in group + line.waiting:
                _settle(done, error=stopped)
            line.waiting = []
            raise
        finally:
            line.writers -= 1
            if not line.writers and not line.waiting and self._lines.get(topic) is line:
                del self._lines[topic]

    async def _write_group(self, group: list[tuple[dict[str, Any], asyncio.Future[int]]]) -> None:
        if len(group) > 1:
            try:
                ids = await self._batch([params for params, _ in group])
            except DatabaseUnavailable as error:
                for _, done in group:
                    _settle(done, error=error)
                return
            except (CourierError, psycopg.Error):
                pass  # some message of it is refused: each is written alone below, for its own answer
            else:
                for (_, done), new_id in zip(group, ids, strict=True):
                    _settle(done, new_id)
                return
        for params, done in group:
            await _answer(done, self._one(params))

    async def _one(self, params: dict[str, Any]) -> int:
        async with self.session() as conn:
            return await queries.fetch_value_async(conn, "pull_enqueue", params)

    async def _batch(self, group: list[dict[str, Any]]) -> list[int]:
        async with self.session() as conn:
            return await enqueue_run(conn, group)


async def enqueue_run(conn: psycopg.AsyncConnection, run: list[dict[str, Any]]) -> list[int]:
    """Enqueue unkeyed messages of one topic (pull_enqueue's parameters each) in one statement;
    their ids, in order."""
    def column(name: str) -> list[Any] | None:
        values = [params[name] for params in run]
        return None if all(value is None for value in values) else values

    return await queries.fetch_value_async(conn, "pull_enqueue_batch", {
        "topic": run[0]["topic"], "payloads": [params["payload"] for params in run],
        **{name: column(name) for name in ("metadata", "scheduled_at", "ttl_seconds", "max_retries")}})


def _settle(done: asyncio.Future[int], value: int | None = None, *, error: BaseException | None = None) -> None:
    if done.done():  # its request was cancelled meanwhile
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(value)  # type: ignore[arg-type]


async def _answer(done: asyncio.Future[int], work: Awaitable[int]) -> None:
    try:
        _settle(done, await work)
    except asyncio.CancelledError:
        _settle(done, error=DatabaseUnavailable("the server is stopping"))
        raise
    except Exception as error:  # the request's own answer, whatever it is
        _settle(done, error=error)
