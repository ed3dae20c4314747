"""A process whose job is one worker pool, with an exit that is bounded whatever the database
(or a maintenance job's thread) does; see sqlkit.stopping for the bounded steps themselves."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlkit.stopping import cancel_within, within

log = logging.getLogger("courier.worker")

PROCESS_TEARDOWN = 1.0
"""Seconds a pool's process gives its last tasks and threads once the pool has stopped."""


def run_pool_process(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run(main) for a process whose job is one worker pool, with a bounded exit.

    asyncio.run waits without limit for the tasks still running when main returns and for the
    threads of its executor (a maintenance job in a thread can hang on a dead connection), and
    so does the interpreter's exit. Once the pool has stopped, its claims are released or, once
    it has exited, recovered by the maintenance leader, and there is nothing left to save: what
    has not ended PROCESS_TEARDOWN seconds later is left behind, and the process exits at once."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # The loop's executor is ours, so that its shutdown can be waited for with a bound
    # (loop.shutdown_default_executor joins its helper thread even when cancelled).
    executor = ThreadPoolExecutor(thread_name_prefix="courier-pool")
    loop.set_default_executor(executor)
    clean = False
    try:
        loop.run_until_complete(main)
    finally:
        try:
            clean = loop.run_until_complete(_teardown(loop, executor))
        finally:
            asyncio.set_event_loop(None)
            loop.close()
    if not clean:
        log.warning("exiting with work left behind; the maintenance leader recovers any claim it "
                    "held within seconds of the exit")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


async def _teardown(loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor) -> bool:
    """Cancel what is left and shut the executor down, within PROCESS_TEARDOWN: True if
    everything ended."""
    deadline = loop.time() + PROCESS_TEARDOWN
    if not await cancel_within(asyncio.all_tasks(loop) - {asyncio.current_task(loop)}, PROCESS_TEARDOWN):
        return False
    await loop.shutdown_asyncgens()
    threads_ended = loop.create_future()

    def shut_down() -> None:  # in a daemon thread: one that never ends cannot hold the exit
        executor.shutdown(wait=True)
        loop.call_soon_threadsafe(lambda: threads_ended.done() or threads_ended.set_result(None))

    threading.Thread(target=shut_down, name="courier-pool-shutdown", daemon=True).start()
    return await within(deadline - loop.time(), threads_ended, "threads")
