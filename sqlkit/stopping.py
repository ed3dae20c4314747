"""Stopping, and waiting for an answer, within a bound whatever the database does.

asyncio.wait_for and asyncio.timeout are not hard bounds: at their deadline they cancel the
awaited work and then wait for it to end. A psycopg query cancelled while its server does not
answer (a network partition that drops packets) ends only after psycopg's own cancel request
and wait, 5 s each. Here the work runs as a task of its own, and at the deadline it is
cancelled and abandoned instead: it ends on its own time, and the stop goes on without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

from .errors import DatabaseUnavailable

log = logging.getLogger("courier.stopping")

T = TypeVar("T")


async def within(seconds: float, work: Awaitable[object], what: str) -> bool:
    """Await `work` for at most `seconds`. True if it ended in time (its errors are logged, not
    raised); False if it was abandoned."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(seconds, 0.0))
    except asyncio.CancelledError:
        task.cancel()  # whoever waits is cancelled: so is the work, as if awaited directly
        raise
    if not done:
        task.cancel()
        log.warning("stopping without waiting any longer for %s (%g s)", what, seconds)
        return False
    error = None if task.cancelled() else task.exception()
    if error is not None:
        log.warning("%s failed while stopping: %s: %s", what, type(error).__name__, error)
    return True


async def cancel_within(tasks: Iterable[asyncio.Task[Any]], seconds: float) -> bool:
    """Cancel `tasks` and give them at most `seconds` to end: True if they all did."""
    tasks = [task for task in tasks if not task.done()]
    for task in tasks:
        task.cancel()
    if not tasks:
        return True
    _, stuck = await asyncio.wait(tasks, timeout=seconds)
    if stuck:
        log.warning("stopping without waiting for tasks: %s", ", ".join(sorted(task.get_name() for task in stuck)))
    return not stuck


async def answer_within(seconds: float, work: Awaitable[T], what: str) -> T:
    """The result of `work`, or DatabaseUnavailable when it gets no answer within `seconds`: a
    call a running client makes must not wait for TCP to give up on a database that stopped
    answering, many minutes later. Unlike `within`, the call is cancelled, not abandoned, so
    nothing else is left using its connection; psycopg's cancellation of the query adds at
    most 10 s (a cancel request, then a wait for the query to end) before it closes the
    connection, which the pool then drops."""
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        raise DatabaseUnavailable(f"{what}: no answer from the database within {seconds:g} s "
                                  f"(unreachable, or the call is blocked)") from None
