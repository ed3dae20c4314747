"""`courier console` (and bare `courier`): the Textual operator console, optionally with an
embedded worker pool running beside it in a child process."""

from __future__ import annotations

import logging
import sys

import click
import platformdirs

from sqlkit import embedded, migrate
from sqlkit.dsn import resolve_dsn

from .context import console, dsn_option, require_current_schema


def pool_log_path():
    return platformdirs.user_log_path("courier") / "embedded-pool.log"


def run_console(url: str, pool=None, seconds: float = 0) -> None:
    """Run the app in this terminal until the operator quits (q, Ctrl-C), SIGTERM arrives or
    `seconds` pass (0: no limit); the caller then stops the pool."""
    from console.app import make_app

    logging.getLogger("courier").propagate = False  # the UI owns the terminal
    make_app(url, pool=pool, exit_after=seconds, exit_on_sigterm=True).run()


def stop_pool(pool) -> None:
    if pool is not None and pool.state.running:
        with console.status("draining the embedded workers (in-flight messages finish)..."):
            pool.stop()


@click.command("console")
@click.option("--workers", type=click.IntRange(0, 10_000), default=0, show_default=True,
              help="Run an embedded worker pool with this many messages in flight (0: only watch).")
@dsn_option
def console_command(workers: int) -> None:
    """Open the operator console (the database from --dsn, COURIER_DSN, ... or the embedded one)."""
    open_console(workers)


def open_console(workers: int) -> None:
    from console.workers.supervisor import EmbeddedPool

    choice = resolve_dsn(click.get_current_context().meta.get("courier.dsn"))
    if not choice.is_embedded:
        require_current_schema(choice.dsn or "", "the console")  # database errors first, in one line
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise click.UsageError("the console needs a terminal; in scripts use `courier status`, "
                               "`courier worker` or `courier demo --headless`")
    started_embedded = False
    if choice.is_embedded:
        started_embedded = not embedded.status().running
        with console.status("starting the embedded PostgreSQL..."):
            url = embedded.start()
            migrate.migrate(url)
    else:
        url = choice.dsn or ""
    pool = EmbeddedPool(url, concurrency=workers or 16, log_path=pool_log_path())
    try:
        if workers:
            pool.start()
        run_console(url, pool)
    finally:
        stop_pool(pool)
        if started_embedded:
            with console.status("stopping the embedded PostgreSQL..."):
                embedded.stop()


COMMANDS = [console_command]
