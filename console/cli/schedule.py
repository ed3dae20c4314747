"""`courier schedule ...`: periodic schedules (issue 42). Each tick of a cron expression, read
in a time zone, sends one message to an endpoint or topic; a running worker's maintenance
leader sends it, once, however many workers run (functions/schedules.sql)."""

from __future__ import annotations

import dataclasses

import click
from rich.table import Table
from rich.text import Text

from sqlkit import exact_json, schedules
from sqlkit.schedules import Schedule, on_its_clock

from .context import (
    common_options,
    console,
    emit,
    open_connection,
    parse_json,
    parse_json_object,
    plain,
    print_table,
    when,
)

STATE_STYLE = {"running": "green", "paused": "yellow", "late": "bold red", "failing": "bold red"}


def state_text(schedule: Schedule) -> Text:
    return Text(schedule.state, style=STATE_STYLE.get(schedule.state, ""))


@click.group("schedule")
def schedule_group() -> None:
    """Periodic schedules: a message sent on every tick of a cron expression."""


@schedule_group.command("create")
@click.argument("name")
@click.argument("cron")
@click.argument("target")
@click.argument("payload", default="{}")
@click.option("--tz", "time_zone", default="UTC", show_default=True,
              help="The IANA time zone the cron expression is read in (Europe/Berlin, America/New_York).")
@click.option("--headers", help="Headers each tick's message carries (a JSON object of strings).")
@click.option("--metadata", help="Metadata each tick's message carries (a JSON object); courier_tick is added.")
@click.option("--priority", type=click.IntRange(0, 10), default=0, show_default=True)
@click.option("--ordering-key", help="Deliver the ticks' messages one at a time, in order, with others of this key.")
@click.option("--catch-up", type=click.Choice(["skip", "all"]), default="skip", show_default=True,
              help="Ticks missed while no worker ran: skip sends at most the latest (if no older than --grace); "
                   "all sends every one, up to --catch-up-limit.")
@click.option("--catch-up-limit", type=click.IntRange(1, 10000), default=100, show_default=True,
              help="With --catch-up all: the most missed ticks sent (the most recent ones).")
@click.option("--grace", "grace_seconds", type=click.IntRange(1, 86400), default=600, show_default=True,
              help="With --catch-up skip: seconds a missed tick may be late and still be sent.")
@click.option("--description", help="Free text shown in the list.")
@click.option("--replace", is_flag=True, help="Change the schedule of this name if there is one.")
@common_options
def create(name: str, cron: str, target: str, payload: str, time_zone: str, headers: str | None,
           metadata: str | None, priority: int, ordering_key: str | None, catch_up: str, catch_up_limit: int,
           grace_seconds: int, description: str | None, replace: bool) -> None:
    """Create schedule NAME: on every tick of CRON, send PAYLOAD (JSON) to TARGET, a push
    endpoint or pull topic.

    CRON has five fields, minute hour day-of-month month day-of-week ("0 3 * * *": daily at
    03:00 in --tz), or @hourly, @daily, @weekly, @monthly, @yearly. A day that never comes
    (30 February) is refused. Each tick is sent once, by the maintenance leader of a running
    `courier worker` (or `courier serve --workers`, or the console's pool)."""
    body = parse_json(payload, "PAYLOAD")
    header_map = parse_json_object(headers, "--headers") if headers is not None else None
    metadata_doc = parse_json_object(metadata, "--metadata") if metadata is not None else None
    with open_connection() as conn:
        schedules.create(conn, name, cron, target, body, time_zone=time_zone, headers=header_map,
                         metadata=metadata_doc, priority=priority, ordering_key=ordering_key, catch_up=catch_up,
                         catch_up_limit=catch_up_limit, grace_seconds=grace_seconds, description=description,
                         replace=replace)
        found = schedules.get(conn, name)
    emit(found, lambda: console.print(
        f"{'saved' if replace else 'created'} schedule {name}: {found.cron} ({found.time_zone}) to "
        f"{found.endpoint_name}; next run {on_its_clock(found.next_run_at, found.time_zone)}", highlight=False,
        soft_wrap=True))


@schedule_group.command("list")
@common_options
def list_command() -> None:
    """List schedules with their next and last run; late ones are overdue (no worker running,
    or each attempt failing)."""
    with open_connection() as conn:
        found = schedules.list_all(conn)

    def render() -> None:
        table = Table(title=f"{len(found)} schedule(s)")
        table.add_column("name", no_wrap=True)
        table.add_column("state")
        table.add_column("cron", no_wrap=True)
        table.add_column("tz")
        table.add_column("target", no_wrap=True)
        table.add_column("next run", no_wrap=True)
        table.add_column("last tick", no_wrap=True)
        table.add_column("sent", justify="right")
        table.add_column("skipped", justify="right")
        table.add_column("last error", overflow="ellipsis", max_width=30)
        for s in found:
            table.add_row(s.name, state_text(s), s.cron, s.time_zone, s.endpoint_name,
                          "-" if s.paused else on_its_clock(s.next_run_at, s.time_zone),
                          on_its_clock(s.last_tick_at, s.time_zone), str(s.sent_ticks),
                          str(s.skipped_ticks), s.last_error or "")
        print_table(table)

    emit(found, render, columns=Schedule)


@schedule_group.command("show")
@click.argument("name")
@click.option("--runs", type=click.IntRange(1, 100), default=5, show_default=True, help="How many next runs to list.")
@common_options
def show(name: str, runs: int) -> None:
    """Show one schedule, the message its ticks send and its next runs."""
    with open_connection() as conn:
        found = schedules.get(conn, name)
        sent = schedules.message(conn, name)
        upcoming = [] if found.paused else schedules.next_runs(conn, found.cron, found.time_zone, runs)
    data = {**dataclasses.asdict(found), "message": sent, "next_runs": upcoming}

    def render() -> None:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for label, value in [
            ("name", found.name), ("state", state_text(found)), ("cron", f"{found.cron} ({found.time_zone})"),
            ("target", f"{found.endpoint_name} ({found.protocol})"),
            ("catch up", f"{found.catch_up}, at most {found.catch_up_limit}" if found.catch_up == "all"
             else f"skip, latest tick if no older than {found.grace_seconds} s"),
            ("next runs", "\n".join(on_its_clock(at, found.time_zone) for at in upcoming) or "- (paused)"),
            ("last tick", on_its_clock(found.last_tick_at, found.time_zone)), ("last sent", when(found.last_sent_at)),
            ("last message", str(found.last_message_id or "-")),
            ("ticks", f"{found.sent_ticks} sent, {found.skipped_ticks} skipped"),
            ("last error", f"{found.last_error} ({when(found.last_error_at)})" if found.last_error else "-"),
            ("payload", Text(exact_json.dumps_like(plain(sent["payload"])))), ("description", found.description or "-"),
            ("created", when(found.created_at)),
        ]:
            table.add_row(label, value)
        print_table(table)

    emit(data, render)


def _pause_or_resume(name: str, pause: bool) -> None:
    with open_connection() as conn:
        changed = schedules.pause(conn, name) if pause else schedules.resume(conn, name)
        found = schedules.get(conn, name)
    if pause:
        line = f"schedule {name} paused" if changed else f"schedule {name} was already paused"
    else:
        line = (f"schedule {name} resumed; next run {on_its_clock(found.next_run_at, found.time_zone)}" if changed
                else f"schedule {name} was not paused")
    emit({"name": name, "paused": pause, "changed": changed, "next_run_at": found.next_run_at},
         lambda: console.print(line, highlight=False))


@schedule_group.command("pause")
@click.argument("name")
@common_options
def pause(name: str) -> None:
    """Pause a schedule: no tick is sent until it is resumed, and the ticks meanwhile are not made up."""
    _pause_or_resume(name, True)


@schedule_group.command("resume")
@click.argument("name")
@common_options
def resume(name: str) -> None:
    """Resume a paused schedule from its next tick."""
    _pause_or_resume(name, False)


@schedule_group.command("drop")
@click.argument("name")
@click.option("--if-exists", is_flag=True, help="No error when there is no such schedule.")
@common_options
def drop(name: str, if_exists: bool) -> None:
    """Drop a schedule. The messages its ticks sent stay."""
    with open_connection() as conn:
        dropped = schedules.drop(conn, name, if_exists)
    emit({"name": name, "dropped": dropped},
         lambda: console.print(f"dropped schedule {name}" if dropped else f"no schedule {name}", highlight=False))


@schedule_group.command("preview")
@click.argument("cron")
@click.option("--tz", "time_zone", default="UTC", show_default=True, help="The IANA time zone to read CRON in.")
@click.option("--count", type=click.IntRange(1, 1000), default=5, show_default=True)
@common_options
def preview(cron: str, time_zone: str, count: int) -> None:
    """List the next times CRON names, without creating anything."""
    with open_connection() as conn:
        runs = schedules.next_runs(conn, cron, time_zone, count)
    def render() -> None:
        for at in runs:
            console.print(on_its_clock(at, time_zone), highlight=False)

    emit(runs, render)


COMMANDS = [schedule_group]
