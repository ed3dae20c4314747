"""The console's embedded worker pool, run as a supervised child process (console.workers.child)
so that full-speed delivery never competes with the UI for the parent's event loop and GIL."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .pool import MAX_CONCURRENCY

STOP_GRACE = 5.0
"""Seconds stop() allows beyond the drain timeout before it sends SIGTERM."""
TERM_GRACE = 3.0
"""Seconds between SIGTERM (which abandons the drain) and SIGKILL."""


@dataclass(frozen=True)
class EmbeddedPoolState:
    running: bool
    pid: int | None
    """The child's pid while it runs, else None."""
    concurrency: int
    """What the pool runs with, or will start with."""
    worker_id: str
    """Its row in courier.workers."""
    exit_code: int | None
    """How the last child ended (negative: killed by that signal); None while running or never started."""
    log_path: Path | None


class EmbeddedPool:
    """Start, scale and stop one worker pool child. Every method may be called from any thread."""

    def __init__(self, dsn: str, *, concurrency: int = 16, worker_id: str | None = None,
                 drain_timeout: float = 10.0, log_path: Path | None = None) -> None:
        self._dsn = dsn
        self._concurrency = _checked(concurrency)
        self._worker_id = worker_id or f"console:{socket.gethostname()}:{os.getpid()}"
        self._drain_timeout = drain_timeout
        self._log_path = log_path
        # _lock guards the fields below and the control pipe, and is only held briefly, so
        # that `state` never waits for a drain; _lifecycle serialises start() and stop().
        self._lock = threading.Lock()
        self._lifecycle = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._exit_code: int | None = None

    @property
    def worker_id(self) -> str:
        return self._worker_id

    def start(self, concurrency: int | None = None) -> None:
        """Spawn the child unless it is running. It runs in a session of its own, so a Ctrl-C
        in the terminal reaches only the parent, which then stops it gracefully."""
        with self._lifecycle, self._lock:
            if concurrency is not None:
                self._concurrency = _checked(concurrency)
            if self._alive():
                return
            # -P: not the working directory's own `console` package (see processes.py).
            command = [sys.executable, "-P", "-m", "console.workers.child", "--concurrency", str(self._concurrency),
                       "--worker-id", self._worker_id, "--drain-timeout", str(self._drain_timeout)]
            env = dict(os.environ)
            if self._dsn:
                env["COURIER_DSN"] = self._dsn  # not --dsn: any user can read a command line
            log: IO[bytes] | int = subprocess.DEVNULL
            if self._log_path is not None:
                self._log_path.parent.mkdir(parents=True, exist_ok=True)
                log = self._log_path.open("ab")
            try:
                self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                 stderr=log, env=env, start_new_session=True)
            finally:
                if not isinstance(log, int):
                    log.close()
            self._exit_code = None

    def scale(self, concurrency: int) -> None:
        """Change the concurrency live; when the child is not running, remember it for start()."""
        concurrency = _checked(concurrency)
        with self._lock:
            self._concurrency = concurrency
            if self._alive():
                self._send({"concurrency": concurrency})

    def stop(self, timeout: float | None = None) -> None:
        """Drain and end the child: a stop line, then SIGTERM after `timeout` (default: the
        drain timeout + 5 s), then SIGKILL. Returns within timeout + 8 s; idempotent."""
        with self._lifecycle:
            with self._lock:
                process = self._process
                if process is None or not self._alive():
                    return
                self._send({"stop": True})
                if process.stdin is not None:  # end of input means stop, too
                    with contextlib.suppress(OSError):
                        process.stdin.close()
            grace = self._drain_timeout + STOP_GRACE if timeout is None else timeout
            for wait, escalate in ((grace, signal.SIGTERM), (TERM_GRACE, signal.SIGKILL), (5.0, None)):
                try:
                    process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    if escalate is not None and process.poll() is None:
                        process.send_signal(escalate)
            with self._lock:
                self._alive()

    @property
    def state(self) -> EmbeddedPoolState:
        with self._lock:
            running = self._alive()
            return EmbeddedPoolState(
                running=running, pid=self._process.pid if running and self._process else None,
                concurrency=self._concurrency, worker_id=self._worker_id,
                exit_code=None if running else self._exit_code, log_path=self._log_path)

    def _alive(self) -> bool:
        """Whether the child runs; records its exit code once it has ended. Needs _lock."""
        if self._process is None:
            return False
        code = self._process.poll()
        if code is None:
            return True
        self._exit_code = code
        if self._process.stdin is not None and not self._process.stdin.closed:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        return False

    def _send(self, command: dict[str, object]) -> None:
        """Write one control line. Needs _lock. A child that just died is found by poll()."""
        stdin = self._process.stdin if self._process is not None else None
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(OSError, ValueError):  # BrokenPipeError, or closed meanwhile
            stdin.write(json.dumps(command).encode() + b"\n")
            stdin.flush()


def _checked(concurrency: int) -> int:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be an integer between 1 and {MAX_CONCURRENCY}, not {concurrency!r}")
    return concurrency
