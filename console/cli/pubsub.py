"""`courier event-type ...`, `courier subscribe`, `courier unsubscribe` and `courier publish`."""

from __future__ import annotations

import json
from uuid import UUID

import click
from rich.table import Table

from sqlkit import pubsub
from sqlkit.errors import CourierError

from .context import common_options, console, emit, open_connection, parse_json, parse_json_object, print_table
from .send import _batch_payloads, _naming_the_line, _read_input


@click.group("event-type")
def event_type_group() -> None:
    """Manage the event types applications publish."""


@event_type_group.command("create")
@click.argument("name")
@click.option("--description", help="Free text shown in `courier event-type list`.")
@common_options
def create(name: str, description: str | None) -> None:
    """Create event type NAME (for example order.created)."""
    with open_connection() as conn:
        event_type_id = pubsub.create_event_type(conn, name, description)
    emit({"id": event_type_id, "name": name},
         lambda: console.print(f"created event type {name} (id {event_type_id})", highlight=False))


@event_type_group.command("drop")
@click.argument("name")
@click.option("--force", is_flag=True, help="Also remove its subscriptions.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@common_options
def drop(name: str, force: bool, yes: bool) -> None:
    """Drop event type NAME (refused while it has subscriptions, unless --force)."""
    if force and not yes:
        click.confirm(f"Drop {name} and remove all of its subscriptions?", abort=True)
    with open_connection() as conn:
        pubsub.drop_event_type(conn, name, force)
    emit({"name": name, "dropped": True}, lambda: console.print(f"dropped event type {name}", highlight=False))


@event_type_group.command("list")
@common_options
def list_command() -> None:
    """List event types and the endpoints subscribed to each, with their filters."""
    with open_connection() as conn:
        found = pubsub.list_event_types(conn)

    def render() -> None:
        table = Table(title=f"{len(found)} event type(s)")
        table.add_column("event type", no_wrap=True)
        table.add_column("subscriber", no_wrap=True)
        table.add_column("filter")
        table.add_column("description", overflow="ellipsis", max_width=30)
        for t in found:
            subscribers = t.subscriptions or [{"endpoint": "", "filter": None}]
            for n, s in enumerate(subscribers):
                table.add_row(t.name if n == 0 else "", s["endpoint"],
                              "" if s["filter"] is None else json.dumps(s["filter"]),
                              (t.description or "") if n == 0 else "")
        print_table(table)

    emit(found, render, columns=pubsub.EventType)


@click.command("subscribe")
@click.argument("event_type")
@click.argument("endpoint")
@click.option("--filter", "filter_text", default="{}", show_default=True,
              help='JSON object; only events whose payload contains it are delivered (payload @> filter).')
@common_options
def subscribe(event_type: str, endpoint: str, filter_text: str) -> None:
    """Deliver EVENT_TYPE events to ENDPOINT (a push endpoint or a pull topic)."""
    filter_doc = parse_json_object(filter_text, "--filter")
    with open_connection() as conn:
        subscription_id = pubsub.subscribe(conn, event_type, endpoint, filter_doc)
    emit({"id": subscription_id, "event_type": event_type, "endpoint": endpoint, "filter": filter_doc},
         lambda: console.print(f"subscribed {endpoint} to {event_type} (subscription {subscription_id})",
                               highlight=False))


@click.command("unsubscribe")
@click.argument("event_type")
@click.argument("endpoint")
@common_options
def unsubscribe(event_type: str, endpoint: str) -> None:
    """Stop delivering EVENT_TYPE events to ENDPOINT."""
    with open_connection() as conn:
        removed = pubsub.unsubscribe(conn, event_type, endpoint)
    emit({"event_type": event_type, "endpoint": endpoint, "unsubscribed": removed},
         lambda: console.print(f"unsubscribed {endpoint} from {event_type}" if removed
                               else f"{endpoint} was not subscribed to {event_type}", highlight=False))


@click.command("publish")
@click.argument("event_type")
@click.argument("payload", required=False)
@click.option("-f", "--file", type=click.File("r"), help="Read the payload from a file ('-' for stdin).")
@click.option("--idempotency-key", help="A retry with the same key and payload queues nothing new.")
@click.option("--correlation-id", type=click.UUID, help="Shared by every subscriber's copy (default: a new one).")
@click.option("--batch", is_flag=True,
              help="The input is a JSON array or JSON Lines of events; publish them with publish_batch.")
@common_options
def publish(event_type: str, payload: str | None, file: click.File | None, idempotency_key: str | None,
            correlation_id: UUID | None, batch: bool) -> None:
    """Publish PAYLOAD (JSON) as an EVENT_TYPE event to every matching subscription."""
    text, source = _read_input(payload, file)
    if batch:
        if idempotency_key is not None or correlation_id is not None:
            raise click.UsageError("--batch takes no --idempotency-key or --correlation-id")
        events, lines = _batch_payloads(text, source)
        with open_connection() as conn:
            try:
                queued = pubsub.publish_batch(conn, event_type, events)
            except CourierError as error:
                raise _naming_the_line(error, source, lines) from None
        emit({"event_type": event_type, "events": len(events), "queued": queued},
             lambda: console.print(f"published {len(events)} {event_type} event(s): {queued} message(s) queued",
                                   highlight=False))
        return
    body = parse_json(text, source)
    with open_connection() as conn:
        queued = pubsub.publish(conn, event_type, body, idempotency_key, correlation_id)
    emit({"event_type": event_type, "queued": queued},
         lambda: console.print(f"published {event_type} to {queued} subscriber(s)", highlight=False))


COMMANDS = [event_type_group, subscribe, unsubscribe, publish]
