"""`courier status`: the queue at a glance, from maintained counters, catalogs and heartbeats."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from sqlkit import observability

from .context import common_options, console, emit, open_connection, when
from .endpoint import circuit_text

HEALTH_STYLE = {"ok": "green", "warning": "yellow", "critical": "bold red"}
CIRCUIT_STATES = {0: "closed", 1: "half_open", 2: "open"}


def snapshot(conn) -> dict[str, Any]:
    metrics = observability.metrics(conn)
    depth_by_status: dict[str, int] = {}
    endpoints: dict[str, dict[str, Any]] = defaultdict(lambda: {"pending": 0, "processing": 0, "dlq_failed": 0})
    oldest = 0.0
    for m in metrics:
        endpoint = m.labels.get("endpoint")
        if m.metric_name == "queue_depth":
            depth_by_status[m.labels["status"]] = int(m.metric_value)
        elif m.metric_name == "queue_depth_by_endpoint" and m.labels["status"] in ("pending", "processing"):
            endpoints[endpoint][m.labels["status"]] = int(m.metric_value)
        elif m.metric_name == "dlq_depth" and m.labels["status"] == "failed":
            endpoints[endpoint]["dlq_failed"] = int(m.metric_value)
        elif m.metric_name == "endpoint_circuit_state":
            endpoints[endpoint]["circuit"] = CIRCUIT_STATES.get(int(m.metric_value), "?")
        elif m.metric_name == "endpoint_enabled":
            endpoints[endpoint]["enabled"] = bool(m.metric_value)
        elif m.metric_name == "oldest_message_age_seconds":
            oldest = m.metric_value
    return {
        "health": observability.health_check(conn),
        "queue_depth": depth_by_status,
        "oldest_pending_age_seconds": oldest,
        "dlq_depth": sum(e["dlq_failed"] for e in endpoints.values()),
        "endpoints": [{"endpoint": name, **values} for name, values in sorted(endpoints.items())],
        "workers": observability.worker_status(conn),
    }


@click.command("status")
@common_options
def status() -> None:
    """Depth by status and endpoint, oldest pending age, DLQ depth, circuits, workers and health."""
    with open_connection() as conn:
        state = snapshot(conn)
    emit(state, lambda: console.print(_render(state)))


def _render(state: dict[str, Any]) -> Group:
    depth = state["queue_depth"]
    headline = Text.assemble(
        ("queue ", "bold"), ", ".join(f"{status} {depth.get(status, 0):,}" for status in ("pending", "processing")),
        ("   oldest pending ", "bold"), _age(state["oldest_pending_age_seconds"]),
        ("   DLQ ", "bold"), f"{state['dlq_depth']:,}")

    endpoints = Table(title="endpoints", title_justify="left")
    for column in ("endpoint", "on", "circuit", "pending", "in flight", "DLQ"):
        endpoints.add_column(column, justify="right" if column in ("pending", "in flight", "DLQ") else "left")
    for e in state["endpoints"]:
        endpoints.add_row(e["endpoint"], "yes" if e.get("enabled", True) else Text("no", style="red"),
                          circuit_text(e.get("circuit", "closed")), f"{e['pending']:,}", f"{e['processing']:,}",
                          f"{e['dlq_failed']:,}")

    workers = Table(title="workers", title_justify="left")
    for column in ("worker", "state", "alive", "leader", "in flight", "delivered", "failed", "last heartbeat"):
        workers.add_column(column)
    for w in state["workers"]:
        workers.add_row(w.worker_id, w.state, "yes" if w.alive else Text("no", style="red"),
                        "yes" if w.maintenance_leader else "", str(w.in_flight), f"{w.delivered:,}",
                        f"{w.failed:,}", when(w.last_heartbeat))

    health = Table(title="health", title_justify="left")
    for column in ("check", "status", "detail"):
        health.add_column(column)
    for check in state["health"]:
        health.add_row(check.check_name, Text(check.status, style=HEALTH_STYLE.get(check.status, "")), check.detail)
    return Group(headline, endpoints, workers, health)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


COMMANDS = [status]
