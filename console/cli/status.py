"""`courier status`: the queue at a glance, from maintained counters, catalogs and heartbeats."""

from __future__ import annotations

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from sqlkit import observability
from sqlkit.observability import QueueStatus

from .context import common_options, console, emit, open_connection, when
from .endpoint import circuit_text

HEALTH_STYLE = {"ok": "green", "warning": "yellow", "critical": "bold red"}


@click.command("status")
@common_options
def status() -> None:
    """Depth by status and endpoint, oldest pending age, DLQ depth, circuits, workers and health."""
    with open_connection() as conn:
        state = observability.queue_status(conn)
    emit(state, lambda: console.print(_render(state)))


def _render(state: QueueStatus) -> Group:
    depth = state.queue_depth
    headline = Text.assemble(
        ("queue ", "bold"), ", ".join(f"{status} {depth.get(status, 0):,}" for status in ("pending", "processing")),
        ("   oldest pending ", "bold"), _age(state.oldest_pending_age_seconds),
        ("   DLQ ", "bold"), f"{state.dlq_depth:,}")

    endpoints = Table(title="endpoints", title_justify="left")
    for column in ("endpoint", "on", "circuit", "pending", "in flight", "DLQ"):
        endpoints.add_column(column, justify="right" if column in ("pending", "in flight", "DLQ") else "left")
    for e in state.endpoints:
        endpoints.add_row(e.endpoint, "yes" if e.enabled else Text("no", style="red"), circuit_text(e.circuit),
                          f"{e.pending:,}", f"{e.processing:,}", f"{e.dlq_failed:,}")

    if not state.workers:
        return Group(headline, endpoints, Text("no worker has sent a heartbeat yet", style="dim"), _health(state))
    workers = Table(title="workers", title_justify="left")
    for column in ("worker", "state", "alive", "leader", "in flight", "delivered", "failed", "last heartbeat"):
        workers.add_column(column)
    for w in state.workers:
        workers.add_row(w.worker_id, w.state, "yes" if w.alive else Text("no", style="red"),
                        "yes" if w.maintenance_leader else "", str(w.in_flight), f"{w.delivered:,}",
                        f"{w.failed:,}", when(w.last_heartbeat))
    return Group(headline, endpoints, workers, _health(state))


def _health(state: QueueStatus) -> Table:
    health = Table(title="health", title_justify="left")
    for column in ("check", "status", "detail"):
        health.add_column(column)
    for check in state.health:
        health.add_row(check.check_name, Text(check.status, style=HEALTH_STYLE.get(check.status, "")), check.detail)
    return health


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


COMMANDS = [status]
