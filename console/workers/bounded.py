"""Stopping within a bound whatever the database does.

asyncio.wait_for and asyncio.timeout are not hard bounds: at their deadline they cancel the
awaited work and then wait for it to end. A psycopg query cancelled while its server does not
answer (a network partition that drops packets) ends only after psycopg's own cancel request
and wait, 5 s each. Here the work runs as a task of its own, and at the deadline it is
cancelled and abandoned instead: it ends on its own time, and the stop goes on without it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any

log = logging.getLogger("courier.worker")

PROCESS_TEARDOWN = 1.0
"""Seconds a pool's process gives its last tasks and threads once the pool has stopped."""


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
        log.warning("stopping without waiting any longer", extra={"for": what, "seconds": seconds})
        return False
    error = None if task.cancelled() else task.exception()
    if error is not None:
        log.warning("failed while stopping", extra={"for": what, "error": f"{type(error).__name__}: {error}"})
    return True


async def cancel_within(tasks: Iterable[asyncio.Task[Any]], seconds: float) -> None:
    """Cancel `tasks` and give them at most `seconds` to end."""
    tasks = [task for task in tasks if not task.done()]
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, stuck = await asyncio.wait(tasks, timeout=seconds)
    if stuck:
        log.warning("stopping without waiting for tasks", extra={"tasks": sorted(task.get_name() for task in stuck)})


def run_pool_process(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run(main) for a process whose job is one worker pool, with a bounded exit.

    asyncio.run waits without limit for the tasks still running when main returns and for the
    threads of its executor (a maintenance job in a thread can hang on a dead connection), and
    so does the interpreter's exit. Once the pool has stopped, its claims are released or left
    to stale recovery and there is nothing left to save: what has not ended PROCESS_TEARDOWN
    seconds later is left behind, and the process exits at once."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    clean = False
    try:
        loop.run_until_complete(main)
    finally:
        try:
            clean = loop.run_until_complete(_teardown(loop))
        finally:
            asyncio.set_event_loop(None)
            loop.close()
    if not clean:
        log.warning("exiting with work left behind; stale recovery takes back any claim it held")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


async def _teardown(loop: asyncio.AbstractEventLoop) -> bool:
    """Cancel what is left and shut the default executor down, within PROCESS_TEARDOWN: True if
    everything ended."""
    deadline = loop.time() + PROCESS_TEARDOWN
    leftovers = asyncio.all_tasks(loop) - {asyncio.current_task(loop)}
    await cancel_within(leftovers, PROCESS_TEARDOWN)
    if any(not task.done() for task in leftovers):
        return False
    await loop.shutdown_asyncgens()
    executor_shutdown = asyncio.ensure_future(loop.shutdown_default_executor())
    return await within(deadline - loop.time(), executor_shutdown, "threads")
