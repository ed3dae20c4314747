"""`courier demo`: an embedded database with demo endpoints and traffic, ready to explore."""

from __future__ import annotations

import click
from rich.table import Table

from sqlkit import embedded, endpoints, messages, migrate, observability
from sqlkit.connection import connect
from sqlkit.dsn import resolve_dsn
from sqlkit.messages import SendOptions

from .context import console, dsn_option
from .endpoint import circuit_text

SINK = "http://127.0.0.1:8787"
DEMO_ENDPOINTS = {
    "demo-healthy": {"url": f"{SINK}/healthy", "allow_internal": True},
    "demo-flaky": {"url": f"{SINK}/flaky", "allow_internal": True},
    "demo-slow": {"url": f"{SINK}/slow", "allow_internal": True, "timeout": 5},
    "demo-down": {"url": "http://127.0.0.1:9/down", "allow_internal": True, "timeout": 2},
}


@click.command("demo")
@click.option("--messages", "count", type=click.IntRange(0, 100_000), default=200, show_default=True)
@dsn_option
def demo(count: int) -> None:
    """Start the embedded PostgreSQL, install the schema, create demo endpoints and traffic."""
    choice = resolve_dsn(click.get_current_context().meta.get("courier.dsn"))
    with console.status("starting the embedded PostgreSQL..."):
        url = embedded.start() if choice.is_embedded else (choice.dsn or "")
        migrate.migrate(url)
    with connect(url) as conn:
        existing = {e.name for e in endpoints.list_all(conn)}
        for name, config in DEMO_ENDPOINTS.items():
            if name not in existing:
                endpoints.create(conn, name, "http", config, description="courier demo")
        for name in DEMO_ENDPOINTS:
            payloads = [{"demo": name, "n": n} for n in range(count // len(DEMO_ENDPOINTS))]
            messages.send_batch(conn, name, payloads)
        messages.send(conn, "demo-healthy", {"urgent": True}, SendOptions(priority=10))
        health = observability.endpoint_health(conn)

    table = Table("endpoint", "circuit", "pending", "oldest pending", title="Courier demo")
    for h in health:
        table.add_row(h.endpoint_name, circuit_text(h.circuit_state), str(h.pending_messages),
                      str(h.oldest_pending_message or "-"))
    console.print(table)
    console.print(
        f"database: {url}\n"
        "Messages are queued. Delivery (the worker pool) and the live console are not built "
        "yet; until they land, explore with `courier endpoint list`, `courier send` and "
        "psql \"$(courier db url)\".", highlight=False)


COMMANDS = [demo]
