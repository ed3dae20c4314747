"""`courier endpoint ...`: create, list, show, alter, enable, disable, pause, resume and drop
endpoints."""

from __future__ import annotations

import json

import click
import psycopg
from rich.table import Table
from rich.text import Text

from sqlkit import endpoints, observability
from sqlkit.endpoints import Endpoint
from sqlkit.errors import NotFound

from ..extras import for_protocol
from .context import (
    common_options,
    console,
    emit,
    error_console,
    open_connection,
    parse_json_object,
    print_table,
    when,
)

PROTOCOLS = ["http", "redis", "amqp", "mqtt", "nats", "noop", "pull"]
"""What a worker delivers to (or, for pull, what consumers take from)."""
NOT_OFFERED = {"kafka": "Kafka is not offered: no dispatcher delivers to it yet, since no Kafka broker could be "
                        "run to test one against; use redis, amqp, mqtt, nats or http"}


def _protocol(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value.lower() in NOT_OFFERED:
        raise click.BadParameter(NOT_OFFERED[value.lower()])
    return click.Choice(PROTOCOLS).convert(value, param, ctx)
CIRCUIT_STYLE = {"closed": "green", "half_open": "yellow", "open": "bold red"}


def circuit_text(state: str) -> Text:
    return Text(state, style=CIRCUIT_STYLE.get(state, ""))


def on_text(enabled: bool, paused: bool) -> Text | str:
    """The "on" column: yes, paused (sends accepted, nothing delivered), or no (disabled)."""
    if not enabled:
        return Text("no", style="red")
    return Text("paused", style="yellow") if paused else "yes"


@click.group("endpoint")
def endpoint_group() -> None:
    """Manage the endpoints messages are delivered to."""


@endpoint_group.command("create")
@click.argument("name")
@click.argument("protocol", callback=_protocol)
@click.argument("config", default="{}")
@click.option("--retry-policy", help='JSON, e.g. {"max_retries": 5, "backoff": "linear"}.')
@click.option("--description", help="Free text shown in the console.")
@common_options
def create(name: str, protocol: str, config: str, retry_policy: str | None,
           description: str | None) -> None:
    """Create endpoint NAME delivering over PROTOCOL (http, redis, amqp, mqtt, nats, noop, or pull for
    a topic consumers take from) with CONFIG (a JSON object)."""
    config_doc = parse_json_object(config, "CONFIG")
    policy = parse_json_object(retry_policy, "--retry-policy") if retry_policy else None
    with open_connection() as conn:
        endpoint_id = endpoints.create(conn, name, protocol, config_doc, policy, description)
        warning = undeliverable_warning(conn, protocol)
    created: dict[str, object] = {"id": endpoint_id, "name": name, "protocol": protocol}
    if warning:
        # Created all the same: a worker that can deliver it may start later.
        created["warning"] = warning
        error_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)
    emit(created, lambda: console.print(f"created endpoint {name} (id {endpoint_id}, {protocol})", highlight=False))


def undeliverable_warning(conn: psycopg.Connection, protocol: str) -> str | None:
    """Why no worker could deliver a new endpoint of `protocol`, or None. The running workers
    say what their installs can deliver; with none running, this install stands for them."""
    extra = for_protocol(protocol)
    if extra is None:
        return None
    able, known = observability.worker_protocols(conn)
    if known:
        if able.get(protocol):
            return None
        return (f"none of the {known} running worker(s) can deliver to {protocol} endpoints: its messages wait "
                f"until one with the {extra.name} extra runs ({extra.install} where the workers run)")
    if extra.installed():
        return None
    return (f"a worker of this install cannot deliver to {protocol} endpoints ({', '.join(extra.missing_modules())} "
            f"missing): its messages wait until a worker with the extra runs; install it with {extra.install}")


@endpoint_group.command("list")
@common_options
def list_command() -> None:
    """List endpoints with their circuit state and queue depth."""
    with open_connection() as conn:
        found = endpoints.list_all(conn)

    def render() -> None:
        table = Table(title=f"{len(found)} endpoint(s)")
        table.add_column("name", no_wrap=True)
        table.add_column("protocol")
        table.add_column("on")
        table.add_column("circuit", no_wrap=True)
        table.add_column("fails", justify="right")
        table.add_column("pending", justify="right")
        table.add_column("in flight", justify="right")
        table.add_column("last error", overflow="ellipsis", max_width=30)
        for e in found:
            table.add_row(e.name, e.protocol, on_text(e.enabled, e.paused),
                          circuit_text(e.circuit_state), str(e.circuit_failure_count),
                          str(e.pending_messages), str(e.processing_messages), e.last_error or "")
        print_table(table)

    emit(found, render, columns=Endpoint)


def _show(e: Endpoint) -> None:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for label, value in [
        ("name", e.name), ("id", str(e.id)), ("protocol", e.protocol),
        ("enabled", "yes" if e.enabled else "no"),
        ("paused", f"since {when(e.paused_at)}" if e.paused else "no"), ("circuit", circuit_text(e.circuit_state)),
        ("failures", str(e.circuit_failure_count)), ("pending", str(e.pending_messages)),
        ("processing", str(e.processing_messages)), ("last success", when(e.last_success_at)),
        ("last failure", when(e.last_failure_at)), ("last error", e.last_error or "-"),
        ("config", json.dumps(e.config, indent=2)),
        ("retry policy", json.dumps(e.retry_policy) if e.retry_policy else "global defaults"),
        ("description", e.description or "-"), ("created", when(e.created_at)),
    ]:
        table.add_row(label, value)
    print_table(table)


@endpoint_group.command("show")
@click.argument("name")
@common_options
def show(name: str) -> None:
    """Show one endpoint (secrets redacted)."""
    with open_connection() as conn:
        found = endpoints.get(conn, name)
    emit(found, lambda: _show(found))


@endpoint_group.command("alter")
@click.argument("name")
@click.option("--config", help="Replacement config (a JSON object), validated for the protocol.")
@click.option("--retry-policy", help="Replacement retry policy (a JSON object).")
@click.option("--description")
@common_options
def alter(name: str, config: str | None, retry_policy: str | None, description: str | None) -> None:
    """Change an endpoint's config, retry policy or description."""
    if config is None and retry_policy is None and description is None:
        raise click.UsageError("nothing to change: give --config, --retry-policy or --description")
    config_doc = parse_json_object(config, "--config") if config is not None else None
    policy = parse_json_object(retry_policy, "--retry-policy") if retry_policy is not None else None
    with open_connection() as conn:
        endpoints.alter(conn, name, config_doc, policy, description)
        found = endpoints.get(conn, name)
    emit(found, lambda: console.print(f"altered endpoint {name}", highlight=False))


def _toggle(name: str, enable: bool) -> None:
    with open_connection() as conn:
        changed = endpoints.enable(conn, name) if enable else endpoints.disable(conn, name)
    state = "enabled" if enable else "disabled"
    emit({"name": name, "enabled": enable, "changed": changed},
         lambda: console.print(f"{name} {state}" if changed else f"{name} was already {state}",
                               highlight=False))


@endpoint_group.command("enable")
@click.argument("name")
@common_options
def enable(name: str) -> None:
    """Enable an endpoint so its messages are claimed again."""
    _toggle(name, True)


@endpoint_group.command("disable")
@click.argument("name")
@common_options
def disable(name: str) -> None:
    """Disable an endpoint: sends are refused and its messages wait."""
    _toggle(name, False)


def pause_or_resume(name: str, pause: bool) -> None:
    """`courier endpoint|topic pause|resume NAME`: one line, or the JSON of what changed."""
    with open_connection() as conn:
        changed = endpoints.pause(conn, name) if pause else endpoints.resume(conn, name)
    state = "paused" if pause else "resumed"
    already = "already paused" if pause else "not paused"
    emit({"name": name, "paused": pause, "changed": changed},
         lambda: console.print(f"{name} {state}" if changed else f"{name} was {already}", highlight=False))


@endpoint_group.command("pause")
@click.argument("name")
@common_options
def pause(name: str) -> None:
    """Pause an endpoint or topic: sends and enqueues are still accepted (up to max_depth), but
    nothing is claimed, dequeued or received until it is resumed (disable refuses sends too)."""
    pause_or_resume(name, True)


@endpoint_group.command("resume")
@click.argument("name")
@common_options
def resume(name: str) -> None:
    """Resume a paused endpoint or topic: its messages are delivered or dequeued again."""
    pause_or_resume(name, False)


@endpoint_group.command("drop")
@click.argument("name")
@click.option("--force", is_flag=True, help="Also delete the endpoint's queued messages.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@common_options
def drop(name: str, force: bool, yes: bool) -> None:
    """Drop an endpoint (refused while it has active messages, unless --force)."""
    if force and not yes:
        click.confirm(f"Drop {name} and delete all of its queued messages?", abort=True)
    with open_connection() as conn:
        endpoints.drop(conn, name, force)
    emit({"name": name, "dropped": True}, lambda: console.print(f"dropped endpoint {name}", highlight=False))


@endpoint_group.command("reset-circuit")
@click.argument("name")
@common_options
def reset_circuit(name: str) -> None:
    """Force an endpoint's circuit breaker back to closed."""
    with open_connection() as conn:
        endpoints.reset_circuit(conn, name)
    emit({"name": name, "circuit_state": "closed"},
         lambda: console.print(f"{name}: circuit closed", highlight=False))


@endpoint_group.command("health")
@click.argument("name", required=False)
@common_options
def health(name: str | None) -> None:
    """get_endpoint_health(): circuit, failures, last success and failure, pending depth."""
    with open_connection() as conn:
        rows = observability.endpoint_health(conn, name)
    if name and not rows:
        raise NotFound(f'endpoint "{name}" does not exist', "P0002", "List endpoints with `courier endpoint list`")

    def render() -> None:
        table = Table(title="endpoint health")
        table.add_column("endpoint", no_wrap=True)
        table.add_column("on")
        table.add_column("circuit", no_wrap=True)
        table.add_column("fails", justify="right")
        table.add_column("pending", justify="right")
        table.add_column("oldest pending", no_wrap=True)
        table.add_column("last success", no_wrap=True)
        for h in rows:
            table.add_row(h.endpoint_name, "yes" if h.enabled else Text("no", style="red"),
                          circuit_text(h.circuit_state), str(h.circuit_failure_count), str(h.pending_messages),
                          when(h.oldest_pending_message), when(h.last_success_at))
        print_table(table)

    emit(rows, render, columns=observability.EndpointHealth)


COMMANDS = [endpoint_group]
