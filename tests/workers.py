"""Helpers to run the worker pool in tests: in-process with asyncio, or as `courier worker`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from console.workers.pool import PoolSettings, WorkerPool

COURIER = str(Path(sys.executable).parent / "courier")


def run_pool_until(dsn: str, done: Callable[[], bool], *, timeout: float = 20.0, **settings: object) -> WorkerPool:
    """Run an in-process pool until done() (checked from a thread) is true, then stop it."""
    options = {"poll_interval": 0.1, "report_interval": 0.005, **settings}
    pool = WorkerPool(dsn, PoolSettings(**options))  # type: ignore[arg-type]

    async def main() -> None:
        task = asyncio.create_task(pool.run())
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and not task.done():
                if await asyncio.to_thread(done):
                    break
                await asyncio.sleep(0.05)
        finally:
            pool.stop()
            await task

    asyncio.run(main())
    return pool


def start_worker_process(dsn: str, *args: str, cwd: str | None = None) -> subprocess.Popen[str]:
    """`courier worker` as one pool in one process (unless args say --processes): the tests that
    kill it, name it or count its heartbeat rows are about one pool. tests/test_worker_processes.py
    runs the default, a pool per core under a supervisor."""
    env = {k: v for k, v in os.environ.items() if k not in ("COURIER_DSN", "DATABASE_URL")}
    if "--processes" not in args:
        args = ("--processes", "1", *args)
    worker = subprocess.Popen([COURIER, "worker", "--dsn", dsn, "--poll-interval", "0.1", *args],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    # Read as it comes: a worker whose database is cut logs a reconnect warning every few
    # milliseconds, and one that filled a pipe nobody read would block on its next log line.
    worker.stdout, worker.stderr = _DrainedPipe(worker.stdout), _DrainedPipe(worker.stderr)  # type: ignore[assignment]
    return worker


class _DrainedPipe:
    """A child's output pipe, read by a thread as the child writes; read() returns all of it
    once the child has closed it (as a pipe's read() would)."""

    def __init__(self, pipe: IO[str]) -> None:
        self._pipe = pipe
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        with contextlib.suppress(ValueError, OSError):  # closed under it (the Popen's __exit__)
            for line in self._pipe:
                self._lines.append(line)

    def read(self) -> str:
        self._reader.join()
        return "".join(self._lines)

    def so_far(self) -> str:
        """What the child has written until now, without waiting for it to end."""
        return "".join(self._lines)

    def close(self) -> None:
        self._pipe.close()


def wait_for(condition: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
