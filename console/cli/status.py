"""`courier status`: the queue at a glance, from maintained counters, catalogs and heartbeats."""

from __future__ import annotations

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from sqlkit import observability
from sqlkit.observability import HealthCheck, QueueStatus

from .context import common_options, emit, open_connection, print_table, when
from .endpoint import circuit_text

HEALTH_STYLE = {"ok": "green", "warning": "yellow", "critical": "bold red"}


@click.command("status")
@common_options
def status() -> None:
    """Depth by status and endpoint, oldest pending age, DLQ depth, circuits, workers and health."""
    with open_connection() as conn:
        state = observability.queue_status(conn)
    emit(state, lambda: print_table(render(state)))


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
    return Group(*parts)


def _endpoints(state: QueueStatus) -> Table:
    table = Table(title="endpoints", title_justify="left")
    for column in ("endpoint", "on", "circuit", "pending", "in flight", "DLQ"):
        table.add_column(column, justify="right" if column in ("pending", "in flight", "DLQ") else "left")
    for e in state.endpoints:
        table.add_row(e.endpoint, "yes" if e.enabled else Text("no", style="red"), circuit_text(e.circuit),
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


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


COMMANDS = [status]
