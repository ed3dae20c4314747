"""`courier worker`: the headless worker pool, with JSON log lines and a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time

import click
from click.core import ParameterSource

from console.logs import log_json_lines
from console.workers.bounded import run_pool_process
from console.workers.pool import MAX_CONCURRENCY, PoolSettings, WorkerPool, default_concurrency
from console.workers.processes import Supervisor, default_processes
from sqlkit.errors import DatabaseUnavailable

from .context import FiniteFloatRange, database_url, dsn_option, log_level_option, require_current_schema


@click.command("worker")
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=default_concurrency(), show_default=True,
              help="Messages in flight at once (default: 512 per core, up to 8 cores, and at least two "
                   "claims of --batch-size per process); also the limit of an endpoint without its "
                   "own config concurrency.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=PoolSettings.batch_size, show_default=True,
              help="Most messages one claim takes.")
@click.option("--poll-interval", type=FiniteFloatRange(0.01, 60), default=1.0, show_default=True,
              help="Seconds between claims of an idle endpoint when no NOTIFY arrives.")
@click.option("--drain-timeout", type=FiniteFloatRange(0, 3600), default=30.0, show_default=True,
              help="On SIGTERM, seconds to let in-flight deliveries finish before releasing them.")
@click.option("--processes", type=click.IntRange(1, 64), default=default_processes(), show_default=True,
              help="Worker pools, each in a process of its own (default: one per core, up to 4); they "
                   "split --concurrency and every endpoint's in-flight limit between them.")
@click.option("--worker-id", help="Name in heartbeats (default: host:pid:random; with several "
                                  "processes, NAME/1, NAME/2, ...).")
@click.option("--wait-for-database", "wait_limit", type=FiniteFloatRange(0, 10**7), default=None,
              help="Seconds to keep retrying, with backoff, a database that cannot be reached at start "
                   "before exiting 1 (default: wait as long as it takes).")
@click.option("--exit-if-unavailable", is_flag=True,
              help="Exit 1 at once if the database cannot be reached at start, instead of waiting for it.")
@log_level_option
@dsn_option
def worker(concurrency: int, batch_size: int, poll_interval: float, drain_timeout: float, processes: int,
           worker_id: str | None, wait_limit: float | None, exit_if_unavailable: bool) -> None:
    """Run the worker pool until SIGTERM or SIGINT, then drain and exit."""
    context = click.get_current_context()
    if context.get_parameter_source("processes") is ParameterSource.DEFAULT:
        processes = min(processes, concurrency)  # --concurrency 1 alone means one pool, not an error
    if context.get_parameter_source("concurrency") is ParameterSource.DEFAULT:
        concurrency = min(MAX_CONCURRENCY, max(concurrency, processes * 2 * batch_size))
    if processes > concurrency:
        raise click.BadParameter(f"{processes} processes cannot share {concurrency} messages in flight; "
                                 "give at least one each", param_hint="'--processes'")
    url = database_url()
    log_json_lines()
    # Under systemd, compose or Kubernetes the database often comes up after the worker.
    _wait_for_database(url, 0 if exit_if_unavailable else wait_limit)
    settings = PoolSettings(concurrency=concurrency, batch_size=batch_size, poll_interval=poll_interval,
                            drain_timeout=drain_timeout)
    if processes > 1:
        sys.exit(Supervisor(url, settings, processes, worker_id=worker_id).run())
    if worker_id:
        settings.worker_id = worker_id
    pool = WorkerPool(url, settings)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, pool.stop)
        await pool.run()

    run_pool_process(main())


log = logging.getLogger("courier.worker")

RETRY_FIRST = 0.5
RETRY_MOST = 10.0
"""Seconds between attempts to reach the database at start: doubling from the first to the most."""


class _Stopped(Exception):
    pass


def _wait_for_database(url: str, limit: float | None) -> None:
    """Return once the database answers with the current schema. While it cannot be reached,
    retry with backoff, a log line per attempt, for at most `limit` seconds (None: without
    end); past it, or at once with limit 0, fail in one line. A schema that is missing or
    old fails at once: waiting would not fix it. SIGTERM or SIGINT while waiting exits 0."""
    def stop(signum: int, frame: object) -> None:
        raise _Stopped

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    started = time.monotonic()
    attempt = 0
    delay = RETRY_FIRST
    try:
        while True:
            attempt += 1
            try:
                require_current_schema(url, "this worker")
                if attempt > 1:
                    log.info("database reachable", extra={"attempts": attempt})
                return
            except DatabaseUnavailable as error:
                pause = delay if limit is None else min(delay, limit - (time.monotonic() - started))
                if pause <= 0:
                    if limit == 0:
                        raise
                    raise DatabaseUnavailable(
                        f"gave up waiting for the database after {limit:g} s ({attempt} attempts): {error.message}",
                        error.sqlstate, error.hint) from error
                log.warning("database unavailable; retrying",
                            extra={"attempt": attempt, "retry_in": round(pause, 3), "error": error.one_line()})
            time.sleep(pause)
            delay = min(delay * 2, RETRY_MOST)
    except _Stopped:
        log.info("stopped while waiting for the database", extra={"attempts": attempt})
        sys.exit(0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


COMMANDS = [worker]
