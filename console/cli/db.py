"""`courier db ...` for the embedded PostgreSQL, and `courier migrate`."""

from __future__ import annotations

import sys

import click
from psycopg.conninfo import conninfo_to_dict
from rich.table import Table

from sqlkit import databases, embedded, migrate
from sqlkit.connection import connect
from sqlkit.dsn import resolve_dsn
from sqlkit.errors import InvalidInput

from .context import common_options, console, database_url, emit, json_option, machine_output, print_table

DELETED = "every endpoint, message, DLQ entry, archive partition, event, worker record and API token"
"""What a reset deletes, as its prompt says it."""


class DbGroup(click.Group):
    """`courier db --help` ends with where the data lives, as this machine has it."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_paragraph()
        formatter.write_text(
            f"Where the data lives: the embedded PostgreSQL keeps its files in {embedded.data_dir()} "
            "(COURIER_DATA_DIR=DIR moves it to DIR/pgdata); Courier's queues are its database `courier`. "
            "`courier db reset` empties that database; to remove everything, run `courier db stop`, then "
            f"delete {embedded.data_dir()} (and demo-workers.log beside it); `courier db start` makes a new one. "
            "`courier demo` uses a database of its own, courier_demo, dropped when it exits.")


@click.group("db", cls=DbGroup)
def db_group() -> None:
    """Run the embedded PostgreSQL (used when no DSN is configured), or empty it."""


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


@db_group.command("reset")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (for scripts).")
@click.option("--external", is_flag=True,
              help="Act on the database --dsn, COURIER_DSN, DATABASE_URL or PG* names, which reset otherwise "
                   "refuses: drop its schema courier and install it afresh (the database itself stays).")
@common_options
def db_reset(yes: bool, external: bool) -> None:
    """Empty the embedded database `courier`: drop it, make it afresh and migrate it.

    Deletes every endpoint, message, DLQ entry, archive, event and token in it. Asks first
    (--yes for scripts; without a terminal, --yes is required). Refuses while workers or
    consoles are connected. If this command started the embedded PostgreSQL, it stops it."""
    choice = resolve_dsn(click.get_current_context().meta.get("courier.dsn"))
    if not choice.is_embedded:
        if not external:
            raise InvalidInput(f"courier db reset empties the embedded PostgreSQL, but {choice.source} points at "
                               "another server",
                               hint="unset it to reset the embedded database, or add --external to drop schema "
                                    "courier in the database it names")
        _reset_external(choice.dsn or "", choice.source, yes)
        return
    pgdata = embedded.data_dir()
    if not (pgdata / "PG_VERSION").exists():
        emit({"reset": False, "data_dir": str(pgdata)},
             lambda: console.print(f"nothing to reset: the embedded PostgreSQL has no data in {pgdata}",
                                   highlight=False))
        return
    _confirm(f"Delete database {embedded.DATABASE_NAME} of the embedded PostgreSQL in {pgdata}, with {DELETED} "
             "in it, and make it afresh?", yes)
    started = not embedded.status().running
    admin = embedded.start(database=None)
    try:
        databases.drop(admin, embedded.DATABASE_NAME)  # refuses, naming them, while sessions use it
        url = embedded.start()
        migrate.migrate(url)
        with connect(url) as conn:
            version = migrate.status(conn).installed_version
    finally:
        if started:
            embedded.stop()
    emit({"reset": True, "database": embedded.DATABASE_NAME, "data_dir": str(pgdata), "schema_version": version,
          "embedded_stopped": started},
         lambda: console.print(f"database {embedded.DATABASE_NAME} emptied: made afresh at schema version {version} "
                               f"(data: {pgdata})" + ("; the embedded PostgreSQL is stopped again" if started else ""),
                               highlight=False))


def _reset_external(dsn: str, source: str, yes: bool) -> None:
    name = databases.current_database(dsn)
    host = conninfo_to_dict(dsn).get("host") or "the default host"
    _confirm(f"Drop schema courier in database {name} on {host} (named by {source}), with {DELETED} in it, "
             "and install it afresh?", yes)
    databases.drop_courier_schema(dsn)
    migrate.migrate(dsn)
    with connect(dsn) as conn:
        version = migrate.status(conn).installed_version
    emit({"reset": True, "database": name, "schema_version": version},
         lambda: console.print(f"schema courier in database {name} emptied: installed afresh at schema version "
                               f"{version}", highlight=False))


def _confirm(question: str, yes: bool) -> None:
    """Ask on a terminal; without one (or under --output json/tsv), only --yes goes ahead."""
    if yes:
        return
    if machine_output() or not sys.stdin.isatty():
        raise InvalidInput("courier db reset deletes data and asks first, but there is no terminal to ask on",
                           hint="add --yes to confirm")
    click.confirm(question, abort=True)


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
