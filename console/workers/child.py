"""The embedded worker pool's process: a WorkerPool steered by JSON lines on stdin.

    python -m console.workers.child --dsn DSN --concurrency N --worker-id ID [--drain-timeout S]
        [--batch-size N] [--poll-interval S] [--share I/N] [--niceness N]

Control lines: {"concurrency": N} resizes the pool live, {"stop": true} drains and exits.
End of stdin means the parent is gone (even by kill -9), so the pool drains and exits too;
SIGTERM and SIGINT drain as well, and a second signal gives up on the drain. Logs are JSON
lines on stderr. The DSN may also come from COURIER_DSN, which keeps a password out of `ps`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time

from console.logs import log_json_lines
from sqlkit import embedded
from sqlkit.dsn import resolve_dsn

from .bounded import run_pool_process
from .pool import MAX_CONCURRENCY, PoolSettings, Share, WorkerPool

log = logging.getLogger("courier.worker.child")


EMBEDDED_NICENESS = 5


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    log_json_lines()
    # The console's pool runs beside an operator's UI: when both want the CPU, the UI wins.
    # `courier worker --processes` runs its pools at the worker's own priority (--niceness 0).
    if args.niceness:
        with contextlib.suppress(OSError):
            os.nice(args.niceness)
    choice = resolve_dsn(args.dsn)
    dsn = embedded.url() if choice.is_embedded else choice.dsn
    if dsn is None:
        log.error("no database: pass --dsn or set COURIER_DSN (the embedded PostgreSQL is not running)")
        return 2
    settings = PoolSettings(concurrency=args.concurrency, drain_timeout=args.drain_timeout, share=args.share)
    if args.batch_size is not None:
        settings.batch_size = args.batch_size
    if args.poll_interval is not None:
        settings.poll_interval = args.poll_interval
    if args.worker_id:
        settings.worker_id = args.worker_id
    pool = WorkerPool(dsn, settings)
    try:
        run_pool_process(_run(pool))
    except Exception:
        log.exception("worker pool failed", extra={"worker_id": pool.worker_id})
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m console.workers.child",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="PostgreSQL connection string (default: COURIER_DSN, DATABASE_URL, PG*)")
    parser.add_argument("--concurrency", type=_ranged(1, MAX_CONCURRENCY), default=16)
    parser.add_argument("--worker-id", help="name in heartbeats (default: host:pid:random)")
    parser.add_argument("--drain-timeout", type=float, default=10.0,
                        help="seconds in-flight deliveries may take to finish when stopping")
    parser.add_argument("--batch-size", type=_ranged(1, 10_000), help="most messages one claim takes")
    parser.add_argument("--poll-interval", type=_ranged(0.01, 60, float),
                        help="seconds between claims of an idle endpoint when no NOTIFY arrives")
    parser.add_argument("--share", type=_share, default=Share(),
                        help="I/N: this is pool I (from 0) of the worker's N, which split its per-endpoint limits")
    parser.add_argument("--niceness", type=_ranged(0, 19), default=EMBEDDED_NICENESS,
                        help="how much lower than its parent's this process's CPU priority is")
    return parser


def _ranged(low: float, high: float, kind: type = int):
    def parse(text: str) -> float:
        value = kind(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}")
        return value
    return parse


def _share(text: str) -> Share:
    try:
        index, count = (int(part) for part in text.split("/"))
        return Share(index, count)
    except ValueError as error:  # also a malformed I/N
        raise argparse.ArgumentTypeError(f"expected I/N with 0 <= I < N, got {text!r}") from error


SAME_STOP_WINDOW = 1.0
"""Seconds after a stop line within which a signal is taken as the same stop, not an
escalation: a service manager that signals every process of the worker at once (systemd's
default KillMode) delivers both, in either order. Supervisors escalate only after a drain's
timeout and grace, seconds later."""


class _Stop:
    """How a stop was first asked for (a signal or the control channel), and when."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by: str | None = None
        self.at = 0.0

    def ask(self, by: str) -> tuple[str | None, float]:
        """Record a stop asked for `by`; return how the first one came and how long ago."""
        with self._lock:
            first, since = self.by, time.monotonic() - self.at
            if first is None:
                self.by, self.at = by, time.monotonic()
            return first, since


async def _run(pool: WorkerPool) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(pool.run())
    stop = _Stop()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        first, since = stop.ask("signal")
        if first is None:
            log.info("signal received: draining", extra={"signal": name})
            pool.stop()
        elif first == "control" and since < SAME_STOP_WINDOW:
            log.info("signal received: already draining", extra={"signal": name})
        else:  # an impatient supervisor or operator: claims left behind are recovered at exit
            log.warning("signal received while stopping: abandoning the drain", extra={"signal": name})
            task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    threading.Thread(target=_read_control, args=(pool, stop), name="control", daemon=True).start()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _read_control(pool: WorkerPool, stop: _Stop) -> None:
    """Apply control lines from stdin until it ends. Raw os.read, not sys.stdin: a daemon
    thread blocked inside a buffered reader can abort the interpreter's shutdown."""
    pending = b""
    while True:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                _apply(pool, line, stop)
    log.info("control channel closed: draining", extra={"worker_id": pool.worker_id})
    stop.ask("control")
    with contextlib.suppress(RuntimeError):  # the loop may be gone already
        pool.stop_threadsafe()


def _apply(pool: WorkerPool, line: bytes, stop: _Stop) -> None:
    try:
        command = json.loads(line)
        if not isinstance(command, dict):
            raise ValueError("a control line must be a JSON object")
        if "concurrency" in command:
            value = command["concurrency"]
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError("concurrency must be an integer")
            pool.resize_threadsafe(value)
        if command.get("stop"):
            log.info("stop requested: draining", extra={"worker_id": pool.worker_id})
            stop.ask("control")
            pool.stop_threadsafe()
    except (ValueError, RuntimeError) as error:  # json.JSONDecodeError is a ValueError
        log.warning("control line ignored", extra={"line": line.decode(errors="replace")[:200], "error": str(error)})


if __name__ == "__main__":
    sys.exit(main())
