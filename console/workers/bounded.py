"""A process whose job is one worker pool, with an exit that is bounded whatever the database
(or a maintenance job's thread) does; see sqlkit.stopping for the bounded steps themselves."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Any

from sqlkit.stopping import cancel_within, within

log = logging.getLogger("courier.worker")

PROCESS_TEARDOWN = 1.0
"""Seconds a pool's process gives its last tasks and threads once the pool has stopped."""


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
