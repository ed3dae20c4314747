"""`courier db ...` for the embedded PostgreSQL, and `courier migrate`."""

from __future__ import annotations

import click
from rich.table import Table

from sqlkit import embedded, migrate
from sqlkit.connection import connect

from .context import common_options, console, database_url, emit, json_option, print_table


@click.group("db")
def db_group() -> None:
    """Run the embedded PostgreSQL (used when no DSN is configured)."""


@db_group.command("start")
@json_option
def db_start() -> None:
    """Start the embedded PostgreSQL; it keeps running until `courier db stop`."""
    url = embedded.start()
    emit({"running": True, "url": url, "data_dir": str(embedded.data_dir())},
         lambda: console.print(f"embedded PostgreSQL running\nurl: {url}\ndata: {embedded.data_dir()}",
                               highlight=False))


@db_group.command("stop")
@json_option
def db_stop() -> None:
    """Stop the embedded PostgreSQL."""
    stopped = embedded.stop()
    emit({"stopped": stopped},
         lambda: console.print("stopped" if stopped else "the embedded PostgreSQL was not running"))


@db_group.command("status")
@json_option
def db_status() -> None:
    """Show whether the embedded PostgreSQL is running, and where."""
    state = embedded.status()
    data = {"running": state.running, "url": state.url, "pid": state.pid, "data_dir": str(state.data_dir)}

    def render() -> None:
        if state.running:
            console.print(f"running (pid {state.pid})\nurl: {state.url}\ndata: {state.data_dir}",
                          highlight=False)
        else:
            console.print(f"not running\ndata: {state.data_dir}", highlight=False)

    emit(data, render)
    if not state.running:
        raise SystemExit(1)


@db_group.command("url")
@common_options
def db_url() -> None:
    """Print the connection URL Courier would use (for psql "$(courier db url)")."""
    url = database_url()
    emit({"url": url}, lambda: click.echo(url))


@click.command("migrate")
@click.option("--target", type=click.IntRange(min=migrate.BASELINE_VERSION),
              help="Stop after this migration version.")
@click.option("--status", "show_status", is_flag=True, help="Only show what is installed and pending.")
@click.option("--lock-wait", type=click.FloatRange(0, 3600), default=migrate.DEFAULT_LOCK_WAIT, show_default=True,
              help="Seconds to wait for another session's migration lock before giving up.")
@common_options
def migrate_command(target: int | None, show_status: bool, lock_wait: float) -> None:
    """Install or upgrade schema `courier`; safe to run twice or concurrently."""
    url = database_url()
    if show_status:
        with connect(url) as conn:
            state = migrate.status(conn)
        # A database migrated before the squash is recorded as at the baseline by the next migrate.
        pending = ([f"0001-{migrate.BASELINE_VERSION:04d} recorded as the baseline"] if state.adopts_history else []) \
            + [m.label for m in state.pending]
        data = {"installed_version": state.installed_version, "latest_version": state.latest_version,
                "pending": pending}

        def render() -> None:
            table = Table("installed", "latest", "pending")
            table.add_row(str(state.installed_version), str(state.latest_version), ", ".join(pending) or "none")
            print_table(table)

        emit(data, render)
        return
    with connect(url) as conn:
        adopts_history = migrate.status(conn).adopts_history
    applied = migrate.migrate(url, target=target, lock_wait=lock_wait)
    with connect(url) as conn:
        version = migrate.status(conn).installed_version
    data = {"applied": [m.label for m in applied], "schema_version": version,
            "recorded_as_baseline": adopts_history}

    def render() -> None:
        if adopts_history:
            console.print(f"recorded migrations 0001-{migrate.BASELINE_VERSION:04d} as the baseline "
                          f"{migrate.available()[0].label}, which builds the same schema", highlight=False)
        console.print(f"applied {len(applied)} migration(s): {', '.join(m.label for m in applied)}; "
                      f"schema version {version}" if applied else f"schema is up to date (version {version})",
                      highlight=False)

    emit(data, render)


COMMANDS = [db_group, migrate_command]
