"""A number a producer sends is stored and handed on as PostgreSQL's jsonb keeps it: exactly.

Python's reader rounded 12345678901234567.89 to a float, orjson rounded integers beyond 64 bits
as well, and orjson's writer failed on them: the HTTP API stored another number than it was
sent, and an HTTP dequeue of a message whose metadata held one failed. Each surface here is
the real one: the CLI, `courier serve`, and PostgreSQL comparing what it stored with the text
sent (jsonb equality compares numbers as numeric)."""

from __future__ import annotations

import base64
import json
import urllib.request
from decimal import Decimal

import pytest
from psycopg.types.json import set_json_dumps

from sqlkit import exact_json, messages, tokens
from sqlkit.exact_json import JsonNumber
from tests.helpers import scalar
from tests.test_cli import run
from tests.test_serve import call, orders, server, token  # noqa: F401

EXACT = ('{"amount": 12345678901234567.89, "id": 123456789012345678901234567890, "tiny": 1e-400, '
         '"huge": 1e400, "u64": 18446744073709551615, "i64": -9223372036854775808, "plain": [0.1, 1.5, 7]}')
"""Numbers no float holds, next to ones every reader keeps."""


def stored_exactly(conn, sql: str, params: tuple = (), text: str = EXACT) -> bool:
    return scalar(conn, f"SELECT ({sql}) = %s::jsonb", (*params, text))


@pytest.mark.parametrize("reader", [exact_json.loads, exact_json.fast_loads])
def test_what_is_read_is_written_back_as_the_same_numbers(conn, reader):
    value = reader(EXACT.encode())
    assert value["amount"] == JsonNumber("12345678901234567.89") and value["u64"] == 2**64 - 1
    assert value["plain"] == [0.1, 1.5, 7]  # numbers a float holds stay Python's
    assert stored_exactly(conn, "SELECT %s::jsonb", (exact_json.jsonb(value),))
    assert scalar(conn, "SELECT %s::jsonb", (exact_json.jsonb({"n": 1, "s": "a"}),)) == {"n": 1, "s": "a"}


def test_orjson_reads_what_it_keeps_exactly_and_python_the_rest():
    assert exact_json.fast_loads(b'{"n": 123456789012345678, "s": "1.5"}') == {"n": 123456789012345678, "s": "1.5"}
    assert exact_json.fast_loads(b'{"n": 0.10000000000000000001}') == {"n": JsonNumber("0.10000000000000000001")}
    assert exact_json.fast_loads(b'[1e400]') == [JsonNumber("1e400")]  # orjson refuses it; jsonb takes it
    for not_json in (b'{"n": NaN}', b'{"n": Infinity}', b'{"n": 1', b""):
        with pytest.raises(ValueError):
            exact_json.fast_loads(not_json)


def test_the_cli_sends_enqueues_and_publishes_the_numbers_it_was_given(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('inbox', 'pull', '{}')")
    conn.execute("SELECT courier.create_event_type('order.paid')")
    conn.execute("SELECT courier.subscribe('order.paid', 'hook')")
    for args in (["send", "hook", EXACT, "--metadata", EXACT], ["send", "hook", "--batch", f"[{EXACT}]"],
                 ["enqueue", "inbox", EXACT, "--metadata", EXACT], ["publish", "order.paid", EXACT]):
        result = run(*args, dsn=dsn)
        assert result.code == 0, result
    assert scalar(conn, "SELECT count(*) FILTER (WHERE payload = %s::jsonb) FROM courier.queue", (EXACT,)) == 4
    assert scalar(conn, "SELECT count(*) FILTER (WHERE metadata = %s::jsonb) FROM courier.queue", (EXACT,)) == 2


def test_the_http_api_stores_and_hands_back_the_numbers_it_was_sent(server, conn, orders):  # noqa: F811
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    secret = tokens.create_token(conn, "app", topics=["*"], endpoints=["*"], actions=["enqueue", "consume"])
    payload = base64.b64encode(b'{"k": 1}').decode()
    sent = call(server, "POST", "/api/messages", secret, headers={"Content-Type": "application/json"},
                raw=f'{{"topic": "orders", "payload": "{payload}", "metadata": {EXACT}}}'.encode())
    assert sent[0] == 201, sent
    assert stored_exactly(conn, "SELECT metadata FROM courier.queue WHERE id = %s", (int(sent[1]["id"]),))
    pushed = call(server, "POST", "/api/endpoints/hook/messages", secret, headers={"Content-Type": "application/json"},
                  raw=f'{{"payload": {EXACT}, "metadata": {EXACT}}}'.encode())
    assert pushed[0] == 201, pushed
    assert stored_exactly(conn, "SELECT payload FROM courier.queue WHERE id = %s", (int(pushed[1]["id"]),))
    assert stored_exactly(conn, "SELECT metadata FROM courier.queue WHERE id = %s", (int(pushed[1]["id"]),))

    # One enqueued in SQL, with an integer orjson cannot write: a dequeue of it failed with a
    # 500, and left it leased along with the rest of the batch.
    conn.execute("SELECT courier.enqueue('orders', '{}', p_metadata => %s::jsonb)", (EXACT,))
    handed = dequeued_metadata(server, secret, {"topic": "orders", "count": 10})
    assert len(handed) == 2 and all(scalar(conn, "SELECT %s::jsonb = %s::jsonb", (m, EXACT)) for m in handed)


def dequeued_metadata(base: str, secret: str, body: dict) -> list[str]:
    """The metadata of each message a dequeue answers, read exactly from the server's answer."""
    request = urllib.request.Request(base + "/api/messages/dequeue", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {secret}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = exact_json.loads(response.read())
    return [exact_json.dumps(message["metadata"]) for message in answer["messages"]]


def test_a_number_field_given_more_digits_than_a_float_holds_is_checked_by_name(server, conn, orders):  # noqa: F811
    secret = token(conn, "app", ["consume"])
    status, body, _ = call(server, "POST", "/api/messages/dequeue", secret,
                           raw=b'{"topic": "orders", "count": 123456789012345678901234567890}',
                           headers={"Content-Type": "application/json"})
    assert status == 400 and "count" in body["message"] and "between" in body["message"], body
    status, body, _ = call(server, "POST", "/api/messages/dequeue", secret,
                           raw=b'{"topic": "orders", "wait_seconds": 0.10000000000000000001}',
                           headers={"Content-Type": "application/json"})
    assert status == 200, body


class Colour:
    def __str__(self) -> str:
        return "teal"


def test_the_python_api_writes_decimals_exactly_and_keeps_the_dumps_psycopg_was_set_to_use(conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    exact = messages.send(conn, "hook", {"amount": Decimal("12345678901234567.89"), "n": 1})
    assert scalar(conn, "SELECT payload = '{\"amount\": 12345678901234567.89, \"n\": 1}'::jsonb FROM courier.queue "
                        "WHERE id = %s", (exact,))
    set_json_dumps(lambda value: json.dumps(value, default=str), context=conn)  # an application's own types
    custom = messages.send(conn, "hook", {"colour": Colour()})
    assert scalar(conn, "SELECT payload FROM courier.queue WHERE id = %s", (custom,)) == {"colour": "teal"}
