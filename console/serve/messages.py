"""The pull API's routes (queue-ti's shapes): enqueue, dequeue with a receipt and long poll,
and ack, nack and extend by receipt, one message or a batch. Ids are strings.

A receipt names one dequeue of one message, as an SQS receipt handle does: it is opaque (the
message's id and the random lease that dequeue took, base64url), so a receipt settles only the
message it was issued for (another id answers 409 receipt_mismatch before any SQL runs), and
only while that lease is the message's (an older receipt answers 409 lease_lost). The lease is
drawn at random (courier._next_lease), so no receipt can be guessed from another.

`<topic>.dlq` is a topic like any other here: its messages are the topic's dead letters, their
ids the DLQ entries' ids (what requeue takes), and their receipts settle them by the same
routes. A token consumes it only if its scope names `<topic>.dlq` (or `*`): the scope of
`<topic>` alone does not reach its dead letters. Nothing notifies a `<topic>.dlq`, so a long
poll of one looks again every DLQ_POLL_SECONDS."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import re
import struct
from typing import Any

from aiohttp import web

from sqlkit import exact_json, queries
from sqlkit.tokens import Token

from .auth import require
from .enqueues import enqueue_run
from .input import (
    base64_bytes,
    checked_object,
    described,
    digits,
    integer,
    json_map,
    message_id,
    seconds,
    text,
    timestamp,
)
from .problems import ApiError, bad_request
from .routing import api, reply
from .server import Server
from .wakeups import FULL_BATCH_WAKES

routes = web.RouteTableDef()

MAX_BATCH = 1000
MAX_WAIT_SECONDS = 20.0
"""The longest long poll, as SQS allows."""
DLQ_POLL_SECONDS = 1.0
"""How often a long poll of a `<topic>.dlq` dequeues again while it waits."""


@described({"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": {"type": "object"}})
def _list_of_objects(name: str, value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise bad_request(name, "must be a non-empty list")
    if len(value) > MAX_BATCH:
        raise bad_request(name, f"must hold at most {MAX_BATCH} items, got {len(value)}")
    return value


ENQUEUE = {"topic": text(), "payload": base64_bytes, "key": text(255), "metadata": json_map,
           "scheduled_at": timestamp, "ttl_seconds": integer(1, 31_536_000), "max_retries": integer(0, 1000)}


def _enqueue_params(body: dict[str, Any]) -> dict[str, Any]:
    return {"topic": body["topic"], "payload": body["payload"], "key": body["key"],
            "metadata": exact_json.jsonb(body["metadata"]) if body["metadata"] is not None else None,
            "scheduled_at": body["scheduled_at"], "ttl_seconds": body["ttl_seconds"],
            "max_retries": body["max_retries"]}


@routes.post("/api/messages")
@api(ENQUEUE, required=("topic", "payload"), ok=201)
async def enqueue(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Enqueue a message (a keyed one replaces the topic's pending message of that key, same id)."""
    server = Server.of(request)
    require(token, "enqueue", topic=body["topic"])
    new_id = await server.enqueues.enqueue(_enqueue_params(body))
    return reply({"id": str(new_id)}, status=201)


@routes.post("/api/messages/batch")
@api({"messages": _list_of_objects}, required=("messages",), ok=201)
async def enqueue_batch(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Enqueue messages in one transaction: all are enqueued, or none."""
    server = Server.of(request)
    checked = [checked_object(f"messages[{n}].", item, ENQUEUE, ("topic", "payload"))
               for n, item in enumerate(body["messages"])]
    for item in checked:
        require(token, "enqueue", topic=item["topic"])
    # Each run of unkeyed messages for one topic is one statement; keyed ones go alone.
    runs = [(keyed, list(run)) for (_, keyed), run in itertools.groupby(
        map(_enqueue_params, checked), key=lambda params: (params["topic"], params["key"] is not None))]
    ids: list[int] = []
    async with server.session("application") as conn:
        if len(runs) == 1 and not runs[0][0]:  # one statement: a transaction of its own in autocommit
            ids = await enqueue_run(conn, runs[0][1])
        else:
            async with conn.transaction():
                for keyed, run in runs:
                    if keyed or len(run) == 1:
                        ids += await queries.fetch_values_many_async(conn, "pull_enqueue", run)
                    else:
                        ids += await enqueue_run(conn, run)
    return reply({"ids": [str(i) for i in ids]}, status=201)


DEQUEUE = {"topic": text(), "count": integer(1, MAX_BATCH), "visibility_timeout_seconds": integer(1, 43_200),
           "wait_seconds": seconds(0, MAX_WAIT_SECONDS)}


@routes.post("/api/messages/dequeue")
@api(DEQUEUE, required=("topic",))
async def dequeue(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Lease up to `count` messages; with wait_seconds, wait for one to arrive (LISTEN/NOTIFY)."""
    server = Server.of(request)
    require(token, "consume", topic=body["topic"])
    params = {"topic": body["topic"], "count": body["count"] or 1,
              "visibility_timeout": body["visibility_timeout_seconds"]}
    rows = await _poll(request, server, body["topic"], params, body["wait_seconds"] or 0.0)
    response = reply({"messages": [_leased(row) for row in rows]})
    if rows:
        # Written here, not after the handler returns, so that a client gone by now has its
        # leases given back untouched (no attempt counted) instead of held to their timeout.
        try:
            if _client_gone(request):
                raise ConnectionResetError("the client went away")
            await response.prepare(request)
            await response.write_eof()
        except ConnectionResetError:
            await _release(server, rows)  # aiohttp then finds the client gone and writes nothing
    return response


CLIENT_CHECK_SECONDS = 0.5
"""How often a waiting long poll looks whether its client is still there."""


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _release(server: Server, rows: list[dict[str, Any]]) -> None:
    async with server.session("application") as conn:
        await queries.fetch_all_async(conn, "consumer_release", {"ids": [row["id"] for row in rows],
                                                                "leases": [row["lease"] for row in rows]})


async def _poll(request: web.Request, server: Server, topic: str, params: dict[str, Any],
                wait: float) -> list[dict[str, Any]]:
    """Dequeue; with `wait`, wait in the topic's line until a NOTIFY wakes this poll, and pass
    a wake-up it did not answer on to the next poll in line (see wakeups.py). A poll whose
    client has gone stops waiting and leases nothing."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    if topic.endswith(".dlq"):
        return await _poll_dead_letters(request, server, params, deadline)
    topic_id = await server.topic_id(topic) if wait else None
    rows: list[dict[str, Any]] = []
    waiter: asyncio.Future[None] | None = None
    unanswered = fresh = False  # a wake-up no dequeue has begun after; the last dequeue began after one
    first = True
    try:
        while True:
            waiter = server.wakeups.join(topic_id) if topic_id is not None else None
            if first and waiter is not None:
                await server.wakeups.until_listening(max(0.0, deadline - loop.time()))
            if _client_gone(request):
                return []
            rows = await server.dequeues.dequeue(params)
            fresh, unanswered = unanswered, False
            left = deadline - loop.time()
            if rows or waiter is None or left <= 0 or server.closing:
                return rows
            if first and topic_id is not None:  # it may have looked just before commits left unnotified
                server.wakeups.came_back_empty(topic_id)
            first = False
            while not waiter.done() and left > 0 and not _client_gone(request):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiter), min(left, CLIENT_CHECK_SECONDS))
                left = deadline - loop.time()
            if not waiter.done() or _client_gone(request):
                return rows
            unanswered = True
    finally:
        if topic_id is not None and waiter is not None:
            server.wakeups.leave(topic_id, waiter)
            passes = 1 if unanswered or waiter.done() else 0
            if len(rows) >= params["count"] and (fresh or passes):
                passes = FULL_BATCH_WAKES  # a full batch after a wake-up: the topic may hold more
            if passes:
                server.wakeups.wake(topic_id, passes)


async def _poll_dead_letters(request: web.Request, server: Server, params: dict[str, Any],
                             deadline: float) -> list[dict[str, Any]]:
    """Dequeue from a `<topic>.dlq`, again every DLQ_POLL_SECONDS until the deadline: no NOTIFY
    says when a message is dead-lettered."""
    loop = asyncio.get_running_loop()
    while True:
        if _client_gone(request):
            return []
        async with server.session("application") as conn:
            rows = await queries.fetch_all_async(conn, "pull_dequeue", params)
        if rows or server.closing or loop.time() >= deadline:
            return rows
        pause_until = min(deadline, loop.time() + DLQ_POLL_SECONDS)
        while loop.time() < pause_until and not _client_gone(request) and not server.closing:
            await asyncio.sleep(min(pause_until - loop.time(), CLIENT_CHECK_SECONDS))


def _leased(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": str(row["id"]), "receipt": receipt_for(row["id"], row["lease"]),
            "payload": base64.b64encode(row["payload"]).decode(),
            "metadata": exact_json.fragment(row["metadata"]), "key": row["key"], "retry_count": row["retry_count"],
            "max_retries": row["max_retries"], "created_at": row["created_at"], "visible_until": row["visible_until"]}


RECEIPT = struct.Struct(">qi")
"""A receipt's bytes: the message's id and its lease."""
RECEIPT_SHAPE = re.compile(r"[A-Za-z0-9_-]{16}")
"""base64url of RECEIPT's 12 bytes (no padding needed)."""


def receipt_for(message_id: int, lease: int) -> str:
    return base64.urlsafe_b64encode(RECEIPT.pack(message_id, lease)).decode()


@described({"type": "string", "pattern": "^[A-Za-z0-9_-]{16}$",
            "description": "the receipt a dequeue returned with the message (opaque)"})
def _receipt(name: str, value: Any) -> tuple[int, int]:
    """(message id, lease) of a receipt a dequeue issued."""
    if isinstance(value, str) and RECEIPT_SHAPE.fullmatch(value):
        message, lease = RECEIPT.unpack(base64.urlsafe_b64decode(value))
        if message > 0 and lease != 0:  # a dead letter's lease (of a <topic>.dlq) is negative
            return message, lease
    raise bad_request(name, "must be the receipt a dequeue returned with the message")


ERROR = text(10_000)
DELAY = integer(0, 43_200)
SETTLE_ONE = {"ack": {"receipt": _receipt},
              "nack": {"receipt": _receipt, "error": ERROR, "delay_seconds": DELAY},
              "snooze": {"receipt": _receipt, "delay_seconds": DELAY},
              "extend": {"receipt": _receipt, "visibility_timeout_seconds": integer(1, 43_200)}}
"""The body each verb takes for one message."""
OPTIONAL = {"error", "nack.delay_seconds"}
"""What a body may leave out (a verb's own field as verb.field); the rest is required."""


def _optional(verb: str, name: str) -> bool:
    return name in OPTIONAL or f"{verb}.{name}" in OPTIONAL


def _settle_one_route(verb: str) -> Any:
    fields = SETTLE_ONE[verb]

    @api(fields, required=tuple(name for name in fields if not _optional(verb, name)))
    async def settle(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
        target = message_id(request)
        issued_for, _ = body["receipt"]
        if issued_for != target:
            raise ApiError(409, "receipt_mismatch", f"the receipt was not issued for message {target}: settle the "
                                                   "message its dequeue returned it with", field="receipt")
        topics = token.topics_for("consume")
        kind = (verb, tuple(topics) if topics is not None else None, body.get("error"),
                body.get("visibility_timeout_seconds"), body.get("delay_seconds", 0))
        result = _answer(await Server.of(request).settles.settle(kind, body["receipt"]))
        if result["result"] == "lease_lost":
            raise ApiError(409, "lease_lost", f"message {target}: this receipt's dequeue no longer holds it (its "
                                              "visibility timeout passed, and it was taken back or dequeued again)")
        if result["result"] == "forbidden":
            raise ApiError(403, "forbidden", f"token {token.name!r} may not consume the topic of message {target}")
        if result["result"] == "not_found":
            raise ApiError(404, "not_found", f"message {target} is not leased (acked, nacked or gone)")
        return reply(result)

    settle.__doc__ = SETTLE_DOC[verb] + " (by the receipt its latest dequeue returned)."
    return settle


def _settle_batch_route(verb: str) -> Any:
    shared = {name: check for name, check in SETTLE_ONE[verb].items() if name != "receipt"}

    required = ("messages", *(name for name in shared if not _optional(verb, name)))

    @api({"messages": _list_of_objects, **shared}, required=required)
    async def settle(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
        items = [checked_object(f"messages[{n}].", item, {"id": digits, "receipt": _receipt}, ("id", "receipt"))
                 for n, item in enumerate(body["messages"])]
        matching = [item["receipt"] for item in items if item["receipt"][0] == item["id"]]
        settled = {row["id"]: row for row in await _settle(Server.of(request), token, verb, matching, body)}
        results = [settled[str(item["id"])] if item["receipt"][0] == item["id"]
                   else {"id": str(item["id"]), "result": "receipt_mismatch"} for item in items]
        return reply({"results": results})

    settle.__doc__ = SETTLE_DOC[verb] + ", each by its receipt; a result per message."
    return settle


SETTLE_DOC = {"ack": "Ack leased messages: done, deleted",
              "nack": "Nack leased messages: retried (after delay_seconds), or dead-lettered",
              "snooze": "Snooze leased messages: due again after delay_seconds, no attempt counted",
              "extend": "Extend leased messages' visibility timeout"}
for _verb in SETTLE_ONE:
    routes.post(f"/api/messages/{{id}}/{_verb}")(_settle_one_route(_verb))
    routes.post(f"/api/messages/{_verb}")(_settle_batch_route(_verb))


async def _settle(server: Server, token: Token, verb: str, receipts: list[tuple[int, int]],
                  body: dict[str, Any]) -> list[dict[str, Any]]:
    """Ack, nack or extend the messages of the topics the token may consume, in one call (one
    of another topic is answered 'forbidden' and left alone)."""
    if not receipts:
        return []
    params = {"verb": verb, "ids": [message for message, _ in receipts], "leases": [lease for _, lease in receipts],
              "topics": token.topics_for("consume"), "error": body.get("error"),
              "visibility_timeout": body.get("visibility_timeout_seconds"),
              "delay_seconds": body.get("delay_seconds", 0)}
    async with server.session("application") as conn:
        rows = await queries.fetch_all_async(conn, "pull_settle", params)
    return [_answer(row) for row in rows]


def _answer(row: dict[str, Any]) -> dict[str, Any]:
    """A settle's row as the API answers it."""
    return {"id": str(row["id"]), "result": row["result"],
            **({"visible_until": row["visible_until"]} if row["visible_until"] else {})}
