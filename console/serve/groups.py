"""Requests that arrive together are written together, as PostgreSQL's group commit writes
commits together.

Each request still waits for its own answer, given once what it asked for is committed. While
a write for a key (a topic's enqueues, one kind of settle) is in the database, the requests that
arrive for that key wait in line, and the next write takes the whole line as one statement. A
lone request is written at once: nothing waits on a timer, so an idle server adds no latency,
and a busy one writes in proportion to its load.

A group is all or nothing, but one bad item must fail alone: when a group's write fails (one
message over max_payload_size, a topic with room for only some), each of its items is written
again on its own, and each request gets its own answer. Only an unreachable database fails the
whole line at once, as it would have failed each request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlkit.errors import DatabaseUnavailable

Key = TypeVar("Key", bound=Hashable)
Item = TypeVar("Item")
Result = TypeVar("Result")

Session = Callable[[], Any]
"""An async context manager lending a connection in autocommit (Server.session("application"))."""

MAX_GROUP = 500
"""The most requests one write takes; the rest wait for the next."""
WRITERS = 1
"""Writes in flight per key. One makes the largest groups: under 16 closed-loop clients a
topic's enqueues were answered at 5,571-5,591 a second against 4,848-5,280 with two
(BENCHMARKS.md)."""


@dataclass
class _Line(Generic[Item, Result]):
    waiting: list[tuple[Item, asyncio.Future[Result]]] = field(default_factory=list)
    writers: int = 0


@dataclass
class Groups(Generic[Key, Item, Result]):
    """`write_many(key, items)`: the results of items written in one statement, in their order
    (any error but DatabaseUnavailable: write them one by one instead); `write_one(key, item)`:
    one item's result, or its own error."""

    write_many: Callable[[Key, list[Item]], Awaitable[list[Result]]]
    write_one: Callable[[Key, Item], Awaitable[Result]]
    _lines: dict[Key, _Line[Item, Result]] = field(default_factory=dict)
    _writers: set[asyncio.Task[None]] = field(default_factory=set)

    async def submit(self, key: Key, item: Item) -> Result:
        line = self._lines.setdefault(key, _Line())
        done: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        line.waiting.append((item, done))
        if line.writers < WRITERS:
            line.writers += 1
            writer = asyncio.create_task(self._write(key, line))
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        return await done

    async def _write(self, key: Key, line: _Line[Item, Result]) -> None:
        group: list[tuple[Item, asyncio.Future[Result]]] = []
        try:
            while line.waiting:
                group, line.waiting = line.waiting[:MAX_GROUP], line.waiting[MAX_GROUP:]
                await self._write_group(key, group)
        except BaseException as error:  # no request is left waiting for an answer that never comes
            cancelled = isinstance(error, asyncio.CancelledError)
            stopped = DatabaseUnavailable("the server is stopping") if cancelled else error
            for _, done in group + line.waiting:
                _settle(done, error=stopped)
            line.waiting = []
            raise
        finally:
            line.writers -= 1
            if not line.writers and not line.waiting and self._lines.get(key) is line:
                del self._lines[key]

    async def _write_group(self, key: Key, group: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        if len(group) > 1:
            try:
                results = await self.write_many(key, [item for item, _ in group])
            except DatabaseUnavailable as error:
                for _, done in group:
                    _settle(done, error=error)
                return
            except Exception:  # some item of it is refused: each is written alone below
                pass
            else:
                for (_, done), result in zip(group, results, strict=True):
                    _settle(done, result)
                return
        for item, done in group:
            try:
                _settle(done, await self.write_one(key, item))
            except asyncio.CancelledError:
                _settle(done, error=DatabaseUnavailable("the server is stopping"))
                raise
            except Exception as error:  # the request's own answer, whatever it is
                _settle(done, error=error)


def _settle(done: asyncio.Future[Result], result: Result | None = None, *,
            error: BaseException | None = None) -> None:
    if done.done():  # its request was cancelled meanwhile
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)  # type: ignore[arg-type]
