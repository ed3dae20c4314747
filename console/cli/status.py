"""`courier status`: the queue at a glance, from maintained counters, catalogs and heartbeats;
with --history, the maintenance leader's samples of it over time."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from sqlkit import observability, samples
from sqlkit.observability import HealthCheck, QueueStatus
from sqlkit.samples import MetricSample
from sqlkit.schedules import LateSchedule

from .context import common_options, emit, error_console, open_connection, print_table, when
from .endpoint import circuit_text, on_text
from .schedule import on_its_clock

HEALTH_STYLE = {"ok": "green", "warning": "yellow", "critical": "bold red"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


class Duration(click.ParamType):
    """A length of time as 90s, 15m, 1h, 1h30m or 2d."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        text = str(value).strip().lower()
        parts = _DURATION.findall(text)
        if not parts or _DURATION.sub("", text).strip():
            self.fail(f"{value!r} is not a duration such as 90s, 15m, 1h, 1h30m or 2d", param, ctx)
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
        if seconds <= 0:
            self.fail(f"{value!r} is not a length of time", param, ctx)
        return timedelta(seconds=seconds)


@click.command("status")
@click.option("--history", is_flag=True,
              help="The maintenance leader's samples instead (one every 10 s): depth, and what was delivered, "
                   "failed and dead-lettered in each interval with its rate; a gap where no leader sampled.")
@click.option("--since", type=Duration(), default=None, metavar="DURATION",
              help="With --history: how far back (90s, 15m, 1h, 2d; default 1h).")
@click.option("--per-endpoint", is_flag=True, help="With --history: each endpoint's samples, not the whole queue's.")
@common_options
def status(history: bool, since: timedelta | None, per_endpoint: bool) -> None:
    """Depth by status and endpoint, oldest pending age, DLQ depth, circuits, workers and health."""
    if not history and (since is not None or per_endpoint):
        raise click.UsageError("--since and --per-endpoint choose what --history prints; give --history too")
    if history:
        _history(since or timedelta(hours=1), per_endpoint)
        return
    with open_connection() as conn:
        state = observability.queue_status(conn)
    emit(state, lambda: print_table(render(state)))


def _history(since: timedelta, per_endpoint: bool) -> None:
    with open_connection() as conn:
        now = conn.execute("SELECT now()").fetchone()[0]
        rows = samples.history(conn, now - since, per_endpoint=per_endpoint)
    emit(rows, lambda: _print_history(rows, now, since), columns=MetricSample)


def _print_history(rows: list[MetricSample], now: datetime, since: timedelta) -> None:
    if not rows:
        error_console.print(f"no samples in the last {_span(since.total_seconds())}: the maintenance leader of a "
                            "running `courier worker` takes one every 10 s", highlight=False, soft_wrap=True)
        return
    per_endpoint = any(r.endpoint_name is not None for r in rows)
    table = Table(title=f"samples of the last {_span(since.total_seconds())}"
                        + (", per endpoint" if per_endpoint else ", whole queue"), title_justify="left")
    columns = (["endpoint"] if per_endpoint else []) + [
        "at", "seconds", "pending", "in flight", "DLQ", "delivered", "/s", "failed", "/s", "dead-lettered", "/s"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("endpoint", "at") else "right")
    shown_gaps: set[datetime] = set()
    for r in rows:
        if r.gap and r.sampled_at not in shown_gaps:
            shown_gaps.add(r.sampled_at)  # one gap row per sample time, not one per endpoint
            gap = Text(f"gap of {_span(r.seconds or 0)}", style="yellow")
            table.add_row(*([""] if per_endpoint else []), gap, *[""] * (len(columns) - 1 - per_endpoint))
        table.add_row(*([r.endpoint_name or ""] if per_endpoint else []),
                      _clock(r.sampled_at), _number(r.seconds, 1), f"{r.pending:,}", f"{r.processing:,}",
                      f"{r.dlq:,}", _number(r.delivered), _number(r.delivered_per_second, 1), _number(r.failed),
                      _number(r.failed_per_second, 1), _number(r.dead_lettered),
                      _number(r.dead_lettered_per_second, 1))
    last = rows[-1]
    silent = (now - last.sampled_at).total_seconds()
    if silent > 2 * last.interval_seconds:
        table.add_row(*([""] if per_endpoint else []),
                      Text(f"gap of {_span(silent)} so far", style="yellow"), *[""] * (len(columns) - 1 - per_endpoint))
    table.caption = "a gap: no maintenance leader took a sample for more than two intervals"
    table.caption_justify = "left"
    print_table(table)


def _clock(at: datetime) -> str:
    return at.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _number(value: float | None, places: int = 0) -> str:
    return "-" if value is None else f"{value:,.{places}f}"


def _span(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min" + (f" {seconds % 60} s" if seconds % 60 else "")
    return f"{seconds / 3600:.1f} h"


def render(state: QueueStatus, title: str | None = None, compact: bool = False) -> Group:
    """The status as rich renderables; compact fits a 24-line terminal (workers in one line,
    only the health checks that are not ok)."""
    depth = state.queue_depth
    headline = Text.assemble(
        *([(title + "\n", "bold cyan")] if title else []),
        ("queue ", "bold"), ", ".join(f"{status} {depth.get(status, 0):,}" for status in ("pending", "processing")),
        ("   oldest pending ", "bold"), _age(state.oldest_pending_age_seconds),
        ("   DLQ ", "bold"), f"{state.dlq_depth:,}")
    alive = [w for w in state.workers if w.alive]
    if compact:
        headline.append_text(Text.assemble(("   workers ", "bold"), f"{len(alive)} alive, "
                                           f"{sum(w.delivered for w in alive):,} delivered"))
    parts = [headline, _endpoints(state)]
    if not compact:
        parts.append(_workers(state) if state.workers else Text("no worker has sent a heartbeat", style="dim"))
    checks = [c for c in state.health if c.status != "ok"] if compact else state.health
    if checks:
        parts.append(_health(checks))
    if state.late_schedules:
        parts.append(_late_schedules(state.late_schedules))
    return Group(*parts)


def _endpoints(state: QueueStatus) -> Table:
    table = Table(title="endpoints", title_justify="left")
    for column in ("endpoint", "on", "circuit", "pending", "in flight", "DLQ"):
        table.add_column(column, justify="right" if column in ("pending", "in flight", "DLQ") else "left")
    for e in state.endpoints:
        table.add_row(e.endpoint, on_text(e.enabled, e.paused), circuit_text(e.circuit),
                      f"{e.pending:,}", f"{e.processing:,}", f"{e.dlq_failed:,}")
    return table


def _workers(state: QueueStatus) -> Table:
    table = Table(title="workers", title_justify="left")
    for column in ("worker", "state", "alive", "leader", "in flight", "delivered", "failed", "last heartbeat"):
        table.add_column(column)
    for w in state.workers:
        table.add_row(w.worker_id, w.state, "yes" if w.alive else Text("no", style="red"),
                      "yes" if w.maintenance_leader else "", str(w.in_flight), f"{w.delivered:,}",
                      f"{w.failed:,}", when(w.last_heartbeat))
    return table


def _health(checks: list[HealthCheck]) -> Table:
    table = Table(title="health", title_justify="left")
    for column in ("check", "status", "detail"):
        table.add_column(column)
    for check in checks:
        table.add_row(check.check_name, Text(check.status, style=HEALTH_STYLE.get(check.status, "")), check.detail)
    return table


def _late_schedules(late: list[LateSchedule]) -> Table:
    """One row per late schedule: how late, when it was due on its own clock, and why when its
    sends fail (its last error)."""
    table = Table(title="late schedules", title_justify="left")
    for column in ("schedule", "state", "late", "due", "cron", "last error"):
        table.add_column(column)
    for s in late:
        table.add_row(s.name, Text(s.state, style="bold red"), _age(s.late_seconds),
                      on_its_clock(s.next_run_at, s.time_zone), s.cron, s.last_error or "")
    return table


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


COMMANDS = [status]
