"""`courier worker --processes N`: N worker pools, each in a process of its own, under one
supervisor. One Python process delivering webhooks is bound by its own CPU (its interpreter
runs one thing at a time) well before the database is; N pools use N cores.

Each pool is a console.workers.child process with its share of the worker's limits (see
pool.Share), its own heartbeat row and its own claims; SQL fences claims between them as
between any two workers, and one of them is elected maintenance leader. The supervisor only
starts them, restarts one that dies (after a pause that grows while it keeps dying), and on
SIGTERM or SIGINT asks each to drain, waits for them within the drain timeout, then ends
any that have not. Killed itself, it leaves the pools to notice their control pipe close,
drain and exit on their own.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from .pool import PoolSettings, Share

log = logging.getLogger("courier.worker.supervisor")

STOP_GRACE = 10.0
"""Seconds a pool gets beyond the drain timeout to release its claims and exit: its own bound
after the drain (pool.DRAIN_GRACE, then a pool.STOP_STEP each for its last heartbeat and
dispatchers, its database connections and its process's teardown) and two seconds to spare."""
TERM_GRACE = 3.0
"""Seconds between SIGTERM (which abandons a drain) and SIGKILL."""
RESTART_PAUSES = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Pauses before restarting a pool that died, growing while it keeps dying soon after a start."""
HEALTHY_AFTER = 60.0
"""A pool that ran this many seconds before dying is restarted after the shortest pause."""


def restart_pause(failures: int) -> float:
    """The pause before restarting a child that died `failures` times in a row soon after its
    start (1 for one that ran HEALTHY_AFTER first): the pools here, and `courier serve`'s."""
    return RESTART_PAUSES[min(failures, len(RESTART_PAUSES)) - 1]


def default_processes() -> int:
    """One pool per core this process may run on, up to 4. On two cores, webhook delivery
    (dispatch-http) measured 1.7-2.0k msg/s with two pools against 1.3-1.4k with one, and a
    no-op drain, which the database bounds, the same either way; three pools measured no better
    than two."""
    return max(1, min(len(os.sched_getaffinity(0)), 4))


@dataclass
class _Pool:
    share: Share
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float = 0.0


class Supervisor:
    def __init__(self, dsn: str, settings: PoolSettings, processes: int, *, worker_id: str | None = None) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes}")
        self._dsn = dsn
        self._settings = settings
        self._worker_id = worker_id
        self._pools = [_Pool(Share(index, processes)) for index in range(processes)]
        self._stop = threading.Event()
        self._signals = 0

    def run(self) -> int:
        """Run until SIGTERM or SIGINT, then drain every pool; 0 if all drained cleanly."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        log.info("worker started", extra={"processes": len(self._pools),
                                          "concurrency": self._settings.concurrency})
        while True:
            now = time.monotonic()
            for pool in self._pools:
                self._watch(pool, now)  # the first pass starts them all
            if self._stop.wait(0.2):
                return self._drain()

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("signal received: draining", extra={"signal": signal.Signals(signum).name})
            self._stop.set()
        else:  # an impatient operator: the pools give up their drains too
            log.warning("signal received while stopping: abandoning the drain",
                        extra={"signal": signal.Signals(signum).name})
            self._signal_all(signal.SIGTERM)

    def _command(self, pool: _Pool) -> list[str]:
        settings = self._settings
        # -P: the working directory stays off sys.path, so a package of the user's named like
        # one of ours (a Django app called "console") is not imported in place of it.
        command = [sys.executable, "-P", "-m", "console.workers.child",
                   "--concurrency", str(pool.share.of(settings.concurrency)),
                   "--batch-size", str(settings.batch_size), "--poll-interval", str(settings.poll_interval),
                   "--drain-timeout", str(settings.drain_timeout),
                   "--share", f"{pool.share.index}/{pool.share.count}", "--niceness", "0"]
        if self._worker_id:
            command += ["--worker-id", f"{self._worker_id}/{pool.share.index + 1}"]
        return command

    def _start(self, pool: _Pool) -> None:
        # The DSN goes in the environment, which keeps a password out of `ps`. Logs go
        # straight to this process's stderr, one JSON line each, like its own.
        # A session of its own: Ctrl-C at a terminal (or `timeout`) signals the supervisor alone,
        # which asks each pool to drain and escalates only past the drain timeout.
        pool.process = subprocess.Popen(self._command(pool), stdin=subprocess.PIPE, start_new_session=True,
                                        env={**os.environ, "COURIER_DSN": self._dsn})
        pool.started_at = time.monotonic()
        log.info("pool started", extra={"pool": pool.share.index + 1, "pid": pool.process.pid})

    def _watch(self, pool: _Pool, now: float) -> None:
        """Start a pool that is not running: at once the first time, and after one exited
        while the worker runs, after a pause that grows while it keeps dying soon after
        starting (a database refusing connections, say)."""
        if pool.process is not None:
            code = pool.process.poll()
            if code is None:
                return
            pool.failures = 1 if now - pool.started_at >= HEALTHY_AFTER else pool.failures + 1
            pause = restart_pause(pool.failures)
            log.warning("pool exited; restarting it", extra={"pool": pool.share.index + 1, "pid": pool.process.pid,
                                                               "exit_code": code, "restart_in": pause})
            pool.process = None
            pool.restart_at = now + pause
        if now >= pool.restart_at:
            try:
                self._start(pool)
            except OSError as error:  # out of processes or file descriptors: try again later
                pool.failures += 1
                pool.restart_at = now + restart_pause(pool.failures)
                log.error("pool could not be started", extra={"pool": pool.share.index + 1, "error": str(error)})

    def _drain(self) -> int:
        """Ask every pool to drain, wait for them within the drain timeout (and a grace for the
        release), then end the rest: SIGTERM, which abandons a drain, and SIGKILL."""
        running = [pool.process for pool in self._pools if pool.process is not None]
        for process in running:
            _ask_to_stop(process)
        deadline = time.monotonic() + self._settings.drain_timeout + STOP_GRACE
        _wait_all(running, deadline)
        late = [process for process in running if process.poll() is None]
        if late:
            log.warning("pools still draining at the timeout: ending them", extra={"pids": [p.pid for p in late]})
            for process in late:
                process.terminate()
            _wait_all(late, time.monotonic() + TERM_GRACE)
            for process in late:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        codes = [process.returncode for process in running]
        log.info("worker stopped", extra={"exit_codes": codes})
        return 0 if all(code == 0 for code in codes) else 1

    def _signal_all(self, sig: signal.Signals) -> None:
        for pool in self._pools:
            if pool.process is not None and pool.process.poll() is None:
                pool.process.send_signal(sig)


def _ask_to_stop(process: subprocess.Popen[bytes]) -> None:
    """A stop line, then end of input: either one makes a pool drain and exit."""
    try:
        assert process.stdin is not None
        process.stdin.write(json.dumps({"stop": True}).encode() + b"\n")
        process.stdin.close()
    except (OSError, ValueError):  # it has exited already, or its pipe is closed
        pass


def _wait_all(processes: list[subprocess.Popen[bytes]], deadline: float) -> None:
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return
