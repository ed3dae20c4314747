"""Pull topics from the command line: `courier topic create|alter|list|pause|resume|requeue`, `enqueue`, `dequeue`,
`ack`, `nack`, `receive`, `peek` and `courier reaper run expiry|delete`."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

import click
import psycopg
from rich.table import Table

from sqlkit import exact_json, pull

from .context import (
    common_options,
    console,
    emit,
    open_connection,
    parse_json,
    parse_json_object,
    print_table,
    when,
)
from .endpoint import pause_or_resume
from .send import Timestamp

MAX_COUNT = 10_000
MAX_DELAY = 43_200  # a nack's or snooze's delay: at most a visibility timeout (12 hours)


@click.group("topic")
def topic_group() -> None:
    """Pull topics: endpoints with protocol pull, whose consumers take messages themselves."""


LIMITS = (
    ("max_retries", "max-retries", click.IntRange(0, 1000),
     "Failed attempts retried before a message leaves the topic."),
    ("message_ttl_seconds", "ttl", click.IntRange(0, 31_536_000),
     "Seconds a message lives from when it is due; 0: forever."),
    ("max_depth", "max-depth", click.IntRange(0, 2_147_483_647),
     "Pending + processing messages allowed; enqueue past it is refused. 0: unlimited."),
    ("throughput_limit", "throughput-limit", click.FloatRange(0, 1_000_000),
     "Messages per second dequeue hands out; beyond it, dequeue returns fewer. 0: unlimited."),
    ("dlq_threshold", "dlq-threshold", click.IntRange(0, 1000),
     "Failed attempts after which a message moves to NAME.dlq (at the latest when its retries run out); "
     "0: no DLQ, it ends failed."),
    ("visibility_timeout", "visibility-timeout", click.IntRange(1, 43_200),
     "Default seconds a dequeued message stays invisible to other consumers."),
)
"""A topic's limits, one per sqlkit.pull.TOPIC_LIMITS: (config key, option, type, help)."""
LIMIT_OPTIONS = {key: click.option(f"--{flag}", key, type=kind, help=text) for key, flag, kind, text in LIMITS}
"""The limits as options, for create and alter."""
RESETTABLE = {flag: key for key, flag, _, _ in LIMITS}
"""What `alter --reset` takes: an option's name, for its config key."""
DELAY_OPTION = click.option("--delay-seconds", "delay_seconds", type=click.IntRange(0, 900),
                            help="Seconds each message waits before it is due, unless it gives its own time "
                                 "(SQS delay queues); 0: none.")
"""The topic's delay_seconds: a setting of the topic's own with no global default, so not one of LIMITS."""


def limit_options(command: Any) -> Any:
    for option in reversed(LIMIT_OPTIONS.values()):
        command = option(command)
    return command


def _given(limits: dict[str, Any]) -> dict[str, Any]:
    """The limits given, with whole numbers as integers (500 stays 500 in the config, not 500.0)."""
    return {key: int(value) if isinstance(value, float) and value.is_integer() else value
            for key, value in limits.items() if value is not None}


@topic_group.command("create")
@click.argument("name")
@limit_options
@DELAY_OPTION
@click.option("--description", help="Free text shown in the console.")
@common_options
def create(name: str, description: str | None, **limits: Any) -> None:
    """Create topic NAME. A limit left out follows its global setting (courier config)."""
    config = _given(limits)
    with open_connection() as conn:
        topic_id = pull.create_topic(conn, name, config, description)
    emit({"id": topic_id, "topic": name, "config": config},
         lambda: console.print(f"created topic {name} (id {topic_id})", highlight=False))


@topic_group.command("alter")
@click.argument("name")
@limit_options
@DELAY_OPTION
@click.option("--reset", "resets", multiple=True, type=click.Choice([*RESETTABLE, "all"]),
              help="Revert a limit to its global setting (repeatable; all: every one).")
@common_options
def alter(name: str, resets: tuple[str, ...], **limits: Any) -> None:
    """Change limits of topic NAME; the others stay as they are (queue-ti's topic config)."""
    changes: dict[str, Any] = dict.fromkeys(RESETTABLE.values() if "all" in resets
                                            else (RESETTABLE[r] for r in resets))
    given = _given(limits)
    both = [flag for flag, key in RESETTABLE.items() if key in changes and key in given]
    if both:
        raise click.UsageError(f"--{both[0]} is both set and reset; choose one")
    if not changes and not given:
        raise click.UsageError("nothing to change: give a limit (e.g. --max-depth 1000) or --reset")
    changes.update(given)
    with open_connection() as conn:
        config = pull.alter_topic(conn, name, changes)
    emit({"topic": name, "config": config},
         lambda: console.print(f"topic {name}: " + (", ".join(f"{k}={v}" for k, v in config.items())
                                                   or "every limit follows its global setting"), highlight=False))


@topic_group.command("pause")
@click.argument("name")
@common_options
def pause(name: str) -> None:
    """Pause a topic: enqueues and publishes are still accepted (up to max_depth), dequeue and
    receive hand out nothing until it is resumed; leased messages may still be acked."""
    pause_or_resume(name, True)


@topic_group.command("resume")
@click.argument("name")
@common_options
def resume(name: str) -> None:
    """Resume a paused topic: dequeue and receive hand out its messages again."""
    pause_or_resume(name, False)


@topic_group.command("list")
@common_options
def list_command() -> None:
    """Every topic with its pending, leased and dead-lettered counts and effective limits."""
    with open_connection() as conn:
        rows = pull.topics(conn)

    def render() -> None:
        table = Table(title=f"{len(rows)} topic(s)")
        for column in ("topic", "pending", "leased", "dlq", "next lease ends", "max retries", "ttl s",
                       "max depth", "msg/s", "visibility s", "dlq after"):
            table.add_column(column, justify="left" if column in ("topic", "next lease ends") else "right")
        for row in rows:
            state = " (disabled)" if not row.enabled else " (paused)" if row.paused else ""
            table.add_row(row.topic + state, str(row.pending), str(row.leased),
                          str(row.dead_lettered), when(row.next_visibility_deadline), str(row.max_retries),
                          _limit(row.message_ttl_seconds), _limit(row.max_depth), _limit(row.throughput_limit),
                          str(row.visibility_timeout), _dlq_after(row))
        print_table(table)

    emit(rows, render, columns=pull.Topic)


def _dlq_after(row: pull.Topic) -> str:
    """Failed attempts after which a message moves to the DLQ: the threshold, or its retries."""
    return f"{min(row.dlq_threshold, row.max_retries + 1):g}" if row.dlq_threshold else "no dlq"


def _limit(value: Any) -> str:
    return "-" if not value else f"{value:g}"


@topic_group.command("requeue")
@click.argument("dlq_topic", metavar="TOPIC.dlq")
@click.argument("dlq_id", type=click.IntRange(1, 9_223_372_036_854_775_807))
@common_options
def requeue(dlq_topic: str, dlq_id: int) -> None:
    """Put dead-lettered message DLQ_ID of TOPIC.dlq back on TOPIC, with its retries restored."""
    if not dlq_topic.endswith(".dlq"):
        raise click.BadParameter(f"{dlq_topic!r} is not a dead-letter topic; name it TOPIC.dlq",
                                 param_hint="TOPIC.dlq")
    topic = dlq_topic.removesuffix(".dlq")
    with open_connection() as conn:
        source = pull.dlq_topic(conn, dlq_id)
        if source is not None and source != topic:
            raise click.BadParameter(f"DLQ entry {dlq_id} belongs to {source}.dlq, not {dlq_topic}",
                                     param_hint="DLQ_ID")
        message_id = pull.requeue(conn, dlq_id)
    emit({"dlq_id": dlq_id, "topic": topic, "id": message_id},
         lambda: console.print(f"requeued DLQ entry {dlq_id} on {topic} as message {message_id}", highlight=False))


@click.command("enqueue")
@click.argument("topic")
@click.argument("payload", required=False)
@click.option("-f", "--file", "file", type=click.File("rb"), help="Read the payload from a file ('-' for stdin).")
@click.option("--binary", is_flag=True, help="The payload is bytes (stored as bytea), not JSON.")
@click.option("--key", help="Replace the pending message with this key in place, keeping its id.")
@click.option("--metadata", help="A JSON object stored with the message.")
@click.option("--body", help="A human-readable body string stored with the message.")
@click.option("--scheduled-at", type=Timestamp(), help="Do not hand out before this time.")
@click.option("--ttl", "ttl_seconds", type=click.IntRange(1, 31_536_000),
              help="Seconds this message lives from when it is due (default: the topic's TTL).")
@click.option("--max-retries", type=click.IntRange(0, 1000),
              help="This message's own limit of retries, over the topic's max_retries.")
@common_options
def enqueue(topic: str, payload: str | None, file: Any, binary: bool, key: str | None, metadata: str | None,
            body: str | None, scheduled_at: datetime | None, ttl_seconds: int | None,
            max_retries: int | None) -> None:
    """Add PAYLOAD (JSON, or bytes with --binary) to TOPIC."""
    if payload is not None and file is not None:
        raise click.UsageError("give the payload as an argument or with --file, not both")
    if payload is None and file is None:
        raise click.UsageError("no payload: pass it as an argument or with --file")
    data: bytes = file.read() if file is not None else payload.encode()  # type: ignore[union-attr]
    json_payload: Any = None
    if not binary:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise click.BadParameter("is not UTF-8 text; add --binary to store bytes",
                                     param_hint="PAYLOAD") from None
        json_payload = parse_json(text, "PAYLOAD" if file is None else "--file")
    with open_connection() as conn:
        message_id = pull.enqueue(conn, topic, json_payload, key=key,
                                  metadata=parse_json_object(metadata, "--metadata") if metadata else None,
                                  payload_binary=data if binary else None, body=body, scheduled_at=scheduled_at,
                                  ttl_seconds=ttl_seconds, max_retries=max_retries)
    emit({"topic": topic, "id": message_id},
         lambda: console.print(f"enqueued message {message_id} on {topic}", highlight=False))


def _message_view(message: pull.LeasedMessage | pull.ReceivedMessage) -> dict[str, Any]:
    view: dict[str, Any] = {field: getattr(message, field) for field in message.__dataclass_fields__}
    if message.payload_binary is not None:
        view["payload_binary"] = base64.b64encode(message.payload_binary).decode()
    return view


@click.command("dequeue")
@click.argument("topic")
@click.option("--count", type=click.IntRange(1, MAX_COUNT), default=1, show_default=True)
@click.option("--visibility-timeout", type=click.IntRange(1, 43_200),
              help="Seconds the messages stay invisible to others (default: the topic's).")
@common_options
def dequeue(topic: str, count: int, visibility_timeout: int | None) -> None:
    """Take up to COUNT messages of TOPIC under a lease, highest priority then first due first; ack or
    nack each with its id and lease. TOPIC.dlq hands out TOPIC's dead letters (ids of `courier dlq`),
    oldest first, under negative leases."""
    with open_connection() as conn:
        messages = pull.dequeue(conn, topic, count, visibility_timeout)

    def render() -> None:
        table = Table(title=f"{len(messages)} message(s) from {topic}")
        for column in ("id", "lease", "tries", "visible until", "key", "payload"):
            table.add_column(column, overflow="ellipsis", max_width=60 if column == "payload" else None)
        for m in messages:
            shown = f"<{len(m.payload_binary)} bytes>" if m.payload_binary is not None else _short(m.payload)
            table.add_row(str(m.id), str(m.lease), f"{m.retry_count}/{m.max_retries}", when(m.visible_until),
                          m.key or "", shown)
        print_table(table)

    emit([_message_view(m) for m in messages], render, columns=pull.LeasedMessage)


def _short(value: Any) -> str:
    return exact_json.dumps_like(value)


def _report(conn: psycopg.Connection, message_id: int, lease: int, result: str) -> None:
    said = result.replace("_", " ")
    if result == "not_found" and lease >= 0 and _pending(conn, message_id):
        said = "not leased (it is pending: dequeue it first, and settle it with the lease that returns)"
    elif result == "not_found":
        said = "not found under a lease (acked, nacked, dead-lettered, expired or never sent)"
    elif result == "lease_lost":
        said = "lease lost (its visibility timeout passed; it was taken back or dequeued again)"
    emit({"id": message_id, "lease": lease, "result": result},
         lambda: console.print(f"message {message_id}: {said}", highlight=False))
    if result in ("lease_lost", "not_found"):
        raise SystemExit(1)


def _pending(conn: psycopg.Connection, message_id: int) -> bool:
    """Whether the message waits in the queue unleased (False where this login cannot tell)."""
    try:
        return conn.execute("SELECT status = 'pending' FROM courier.queue WHERE id = %s",
                            (message_id,)).fetchone() == (True,)
    except psycopg.Error:
        return False


SETTLE_SETTINGS = {"ignore_unknown_options": True}
"""A dead letter's lease (dequeued from TOPIC.dlq) is negative: `-123` is a LEASE, not an option."""
LEASE = click.argument("lease", type=click.IntRange(-2_147_483_648, 2_147_483_647))


@click.command("ack", context_settings=SETTLE_SETTINGS)
@click.argument("message_id", type=click.IntRange(1, 9_223_372_036_854_775_807))
@LEASE
@common_options
def ack(message_id: int, lease: int) -> None:
    """Ack MESSAGE_ID held under LEASE: it is done. Exit 1 if the lease was lost."""
    with open_connection() as conn:
        _report(conn, message_id, lease, pull.ack(conn, [message_id], [lease])[0].result)


@click.command("nack", context_settings=SETTLE_SETTINGS)
@click.argument("message_id", type=click.IntRange(1, 9_223_372_036_854_775_807))
@LEASE
@click.option("--error", help="Why it failed, kept in the message's error history.")
@click.option("--delay", type=click.IntRange(0, MAX_DELAY), default=0, show_default=True,
              help="Seconds before it is due again.")
@common_options
def nack(message_id: int, lease: int, error: str | None, delay: int) -> None:
    """Nack MESSAGE_ID held under LEASE: retry it (after --delay), or past max_retries move it to TOPIC.dlq
    (a dead letter of TOPIC.dlq stays there, due again after --delay)."""
    with open_connection() as conn:
        _report(conn, message_id, lease, pull.nack(conn, [message_id], [lease], error, delay)[0].result)


@click.command("snooze", context_settings=SETTLE_SETTINGS)
@click.argument("message_id", type=click.IntRange(1, 9_223_372_036_854_775_807))
@LEASE
@click.argument("seconds", type=click.IntRange(0, MAX_DELAY))
@common_options
def snooze(message_id: int, lease: int, seconds: int) -> None:
    """Give MESSAGE_ID held under LEASE back, due again in SECONDS, without counting an attempt."""
    with open_connection() as conn:
        _report(conn, message_id, lease, pull.snooze(conn, [message_id], [lease], seconds)[0].result)


@click.command("receive")
@click.argument("topic")
@click.option("--count", type=click.IntRange(1, MAX_COUNT), default=1, show_default=True)
@common_options
def receive(topic: str, count: int) -> None:
    """Take and delete up to COUNT messages of TOPIC, highest priority then first due first (destructive)."""
    with open_connection() as conn:
        messages = pull.receive(conn, topic, count)

    def render() -> None:
        table = Table(title=f"{len(messages)} message(s) received from {topic}")
        for column in ("id", "key", "payload"):
            table.add_column(column, overflow="ellipsis", max_width=60 if column == "payload" else None)
        for m in messages:
            shown = f"<{len(m.payload_binary)} bytes>" if m.payload_binary is not None else _short(m.payload)
            table.add_row(str(m.id), m.key or "", shown)
        print_table(table)

    emit([_message_view(m) for m in messages], render, columns=pull.ReceivedMessage)


@click.command("peek")
@click.argument("topic")
@common_options
def peek(topic: str) -> None:
    """An estimate of TOPIC's due messages (TOPIC.dlq: its dead letters)."""
    with open_connection() as conn:
        estimate = pull.peek(conn, topic)
    emit({"topic": topic, "estimate": estimate}, lambda: console.print(str(estimate), highlight=False))


@click.group("reaper")
def reaper_group() -> None:
    """The reapers the maintenance leader runs on schedule, run now."""


@reaper_group.command("run")
@click.argument("reaper", type=click.Choice(["expiry", "delete"]))
@common_options
def run_reaper(reaper: str) -> None:
    """expiry: mark messages past their TTL expired. delete: delete expired pull messages for good."""
    with open_connection() as conn:
        count = pull.run_reaper(conn, reaper)
    verb = "expired" if reaper == "expiry" else "deleted"
    emit({"reaper": reaper, "count": count}, lambda: console.print(f"{verb} {count} message(s)", highlight=False))


COMMANDS = [topic_group, enqueue, dequeue, ack, nack, snooze, receive, peek, reaper_group]
