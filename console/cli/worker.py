"""`courier worker`: the headless worker pool, with JSON log lines and a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import click
from click.core import ParameterSource

from console.logs import log_json_lines
from console.workers.bounded import run_pool_process
from console.workers.pool import PoolSettings, WorkerPool, default_concurrency
from console.workers.processes import Supervisor, default_processes

from .context import FiniteFloatRange, database_url, dsn_option, require_current_schema


@click.command("worker")
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=default_concurrency(), show_default=True,
              help="Messages in flight at once (default: 512 per core, up to 8 cores); also the limit "
                   "of an endpoint without its own config concurrency.")
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
@dsn_option
def worker(concurrency: int, batch_size: int, poll_interval: float, drain_timeout: float, processes: int,
           worker_id: str | None) -> None:
    """Run the worker pool until SIGTERM or SIGINT, then drain and exit."""
    if click.get_current_context().get_parameter_source("processes") is ParameterSource.DEFAULT:
        processes = min(processes, concurrency)  # --concurrency 1 alone means one pool, not an error
    if processes > concurrency:
        raise click.BadParameter(f"{processes} processes cannot share {concurrency} messages in flight; "
                                 "give at least one each", param_hint="'--processes'")
    url = database_url()
    require_current_schema(url, "this worker")  # fail fast, in one line, on a bad DSN or schema
    log_json_lines()
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


COMMANDS = [worker]
