"""`courier send`: enqueue a message (or a batch) from an argument, a file or stdin."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import click

from sqlkit import messages
from sqlkit.errors import CourierError
from sqlkit.messages import SendOptions

from .context import FiniteFloatRange, common_options, console, emit, open_connection, parse_json, parse_json_object

MAX_DELAY_SECONDS = 10 * 365 * 86_400
"""--delay's bound: beyond it a timestamp overflows (1e300 printed a traceback)."""


class Timestamp(click.ParamType):
    """An ISO 8601 time; without a zone it is taken as local time."""

    name = "timestamp"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 time such as 2026-11-22T09:00:00+00:00", param, ctx)
        try:
            return parsed if parsed.tzinfo else parsed.astimezone()
        except (ValueError, OverflowError):  # year 1 or 9999 in local time can fall off the calendar
            self.fail(f"{value!r} in local time is out of range; give a UTC offset such as +00:00", param, ctx)


class Header(click.ParamType):
    name = "key=value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        key, sep, val = str(value).partition("=")
        if not sep or not key.strip():
            self.fail(f"{value!r} is not KEY=VALUE", param, ctx)
        return key.strip(), val


def _read_input(payload: str | None, file: click.File | None) -> tuple[str, str]:
    if payload is not None and file is not None:
        raise click.UsageError("give the payload as an argument or with --file, not both")
    if payload is not None:
        return payload, "PAYLOAD"
    if file is not None:
        return file.read(), "--file"
    if sys.stdin.isatty():
        raise click.UsageError("no payload: pass it as an argument, with --file, or on stdin")
    return sys.stdin.read(), "stdin"


def _batch_payloads(text: str, source: str) -> tuple[list[Any], list[int] | None]:
    """The payloads, and for JSON Lines the input line of each (blank lines are skipped)."""
    if text.strip().startswith("["):
        value = parse_json(text.strip(), source)
        return list(value), None
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    return [parse_json(line, f"{source} line {n}") for n, line in numbered], [n for n, _ in numbered]


_BATCH_ELEMENT = re.compile(r"^batch element (\d+)\b")


def _naming_the_line(error: CourierError, source: str, lines: list[int] | None) -> CourierError:
    """A batch refusal names its element; with JSON Lines, say which input line that is."""
    found = _BATCH_ELEMENT.match(error.message)
    if lines is None or found is None or not 1 <= int(found.group(1)) <= len(lines):
        return error
    return type(error)(f"{source} line {lines[int(found.group(1)) - 1]}: {error.message}", error.sqlstate, error.hint)


@click.command("send")
@click.argument("endpoint")
@click.argument("payload", required=False)
@click.option("-f", "--file", type=click.File("r"), help="Read the payload from a file ('-' for stdin).")
@click.option("--priority", type=click.IntRange(0, 10), default=0, show_default=True,
              help="0-10; higher is delivered first.")
@click.option("--scheduled-at", type=Timestamp(), help="Do not deliver before this time.")
@click.option("--delay", type=FiniteFloatRange(min=0, max=MAX_DELAY_SECONDS),
              help="Do not deliver for this many seconds (at most ten years).")
@click.option("--expires-at", type=Timestamp(), help="Drop the message if not delivered by then.")
@click.option("--ttl", type=FiniteFloatRange(min=0, max=MAX_DELAY_SECONDS, min_open=True),
              help="Expire after this many seconds (at most ten years).")
@click.option("--idempotency-key", help="Deduplicate against active messages with this key.")
@click.option("--correlation-id", type=click.UUID, help="Tracing id carried to the DLQ and archive.")
@click.option("--ordering-key", help="Deliver strictly in order with other messages of this key.")
@click.option("-H", "--header", "headers", type=Header(), multiple=True, help="KEY=VALUE; repeatable.")
@click.option("--metadata", help="A JSON object stored with the message.")
@click.option("--max-retries", type=click.IntRange(0, 1000),
              help="This message's own limit of retries, over the endpoint's retry policy.")
@click.option("--unique", "unique_by_payload", is_flag=True,
              help="Deduplicate by the payload itself (a key derived from it), as an idempotency key does.")
@click.option("--unique-period", type=click.IntRange(1, 31_536_000), metavar="SECONDS",
              help="With --unique (implied): uniqueness holds within each period of SECONDS.")
@click.option("--batch", is_flag=True,
              help="The input is a JSON array or JSON Lines; send it with send_batch (one INSERT).")
@common_options
def send(endpoint: str, payload: str | None, file: click.File | None, priority: int,
         scheduled_at: datetime | None, delay: float | None, expires_at: datetime | None,
         ttl: float | None, idempotency_key: str | None, correlation_id: UUID | None,
         ordering_key: str | None, headers: tuple[tuple[str, str], ...], metadata: str | None,
         max_retries: int | None, unique_by_payload: bool, unique_period: int | None, batch: bool) -> None:
    """Enqueue PAYLOAD (JSON) for ENDPOINT."""
    if scheduled_at and delay is not None:
        raise click.UsageError("--scheduled-at and --delay are alternatives; give one")
    if expires_at and ttl is not None:
        raise click.UsageError("--expires-at and --ttl are alternatives; give one")
    text, source = _read_input(payload, file)
    now = datetime.now(UTC)

    if batch:
        single_only = [idempotency_key, correlation_id, ordering_key, scheduled_at, delay,
                       expires_at, ttl, metadata, max_retries, unique_period, *headers]
        if any(v is not None for v in single_only) or unique_by_payload:
            raise click.UsageError("--batch takes only --priority; other options apply to single sends")
        payloads, lines = _batch_payloads(text, source)
        with open_connection() as conn:
            try:
                ids = messages.send_batch(conn, endpoint, payloads, priority)
            except CourierError as error:
                raise _naming_the_line(error, source, lines) from None
        emit({"endpoint": endpoint, "ids": ids, "count": len(ids)},
             lambda: console.print(f"sent {len(ids)} message(s) to {endpoint}"
                                   + (f": ids {ids[0]}..{ids[-1]}" if ids else ""), highlight=False))
        return

    options = SendOptions(
        priority=priority,
        scheduled_at=scheduled_at or (now + timedelta(seconds=delay) if delay is not None else None),
        idempotency_key=idempotency_key,
        correlation_id=correlation_id,
        expires_at=expires_at or (now + timedelta(seconds=ttl) if ttl is not None else None),
        ordering_key=ordering_key,
        headers=dict(headers) if headers else None,
        metadata=parse_json_object(metadata, "--metadata") if metadata else None,
        max_retries=max_retries,
        unique_by_payload=unique_by_payload or unique_period is not None,
        unique_period_seconds=unique_period,
    )
    body = parse_json(text, source)
    with open_connection() as conn:
        message_id = messages.send(conn, endpoint, body, options)
    emit({"endpoint": endpoint, "id": message_id},
         lambda: console.print(f"sent message {message_id} to {endpoint}", highlight=False))


COMMANDS = [send]
