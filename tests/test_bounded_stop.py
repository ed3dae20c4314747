"""A pool's process exits within its bound even when work it started will not end: a thread
blocked on a dead connection, or a task that takes its time to honour a cancellation."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

PROGRAM = textwrap.dedent("""
    import asyncio, logging, sys, time
    from console.workers.bounded import run_pool_process

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

    async def stubborn():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(30)  # as psycopg does, cancelling a query nobody answers

    async def main():
        asyncio.create_task(stubborn(), name="stubborn")
        asyncio.get_running_loop().run_in_executor(None, time.sleep, {thread_seconds})
        await asyncio.sleep(0.2)
        print("main returned", flush=True)

    run_pool_process(main())
    print("after run_pool_process", flush=True)
""")


def run(program: str, thread_seconds: float) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program.format(thread_seconds=thread_seconds)],
                          capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - began


def test_a_task_and_a_thread_that_will_not_end_are_left_behind_within_a_second():
    done, took = run(PROGRAM, 30)
    assert done.returncode == 0, done.stderr
    assert took < 5, f"the process took {took:.1f} s to exit"
    assert "main returned" in done.stdout and "after run_pool_process" not in done.stdout
    assert "stopping without waiting for tasks" in done.stderr and "work left behind" in done.stderr


def test_a_thread_that_will_not_end_is_left_behind_within_a_second():
    # A maintenance job's thread on a connection that stopped answering: the loop's own
    # shutdown_default_executor joins its helper thread even when cancelled, and hung here.
    done, took = run(PROGRAM.replace('asyncio.create_task(stubborn(), name="stubborn")', ""), 30)
    assert done.returncode == 0, done.stderr
    assert took < 5, f"the process took {took:.1f} s to exit"
    assert "stopping without waiting any longer for threads" in done.stderr and "work left behind" in done.stderr


def test_work_that_ends_in_time_lets_the_process_exit_normally():
    done, took = run(PROGRAM.replace('asyncio.create_task(stubborn(), name="stubborn")', ""), 0.3)
    assert done.returncode == 0, done.stderr
    assert took < 5
    assert "after run_pool_process" in done.stdout and "left behind" not in done.stderr
