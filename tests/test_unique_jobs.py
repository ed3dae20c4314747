"""Unique jobs by payload and by period (issue 42, River's UniqueOpts): a send asks for
uniqueness and Courier derives the idempotency key, through SQL, Python, the CLI and HTTP."""

from __future__ import annotations

import json

import psycopg
import pytest

from sqlkit import messages, tokens
from sqlkit.messages import SendOptions
from tests.helpers import scalar
from tests.test_cli import assert_ok, courier  # noqa: F401  (the fixture)
from tests.test_serve import call, server  # noqa: F401  (the server fixture)

ENDPOINT = "reindex"


@pytest.fixture
def endpoint(conn: psycopg.Connection) -> str:
    conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (ENDPOINT,))
    return ENDPOINT


def send(conn: psycopg.Connection, payload: str, **options: object) -> int:
    named = "".join(f", p_{name} => %({name})s" for name in options)
    return scalar(conn, f"SELECT courier.send_with_options(%(endpoint)s, %(payload)s::jsonb{named})",
                  {"endpoint": ENDPOINT, "payload": payload, **options})


def test_the_same_payload_is_one_message_however_it_is_spelled(conn, endpoint):
    first = send(conn, '{"user": 7, "tags": ["a", "b"]}', unique_by_payload=True)
    assert send(conn, '{ "tags": ["a","b"],   "user": 7 }', unique_by_payload=True) == first  # the same JSON value
    other = send(conn, '{"user": 8, "tags": ["a", "b"]}', unique_by_payload=True)
    assert other != first
    assert send(conn, '{"user": 7, "tags": ["a", "b"]}') not in (first, other)  # not asked: not deduplicated
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 3
    key = scalar(conn, "SELECT idempotency_key FROM courier.queue WHERE id = %s", (first,))
    assert key.startswith("unique:") and len(key) <= 255


def test_a_period_makes_one_message_per_period(conn, endpoint):
    hourly = send(conn, '{"report": "sales"}', unique_by_payload=True, unique_period_seconds=3600)
    assert send(conn, '{"report": "sales"}', unique_by_payload=True, unique_period_seconds=3600) == hourly
    assert send(conn, '{"report": "sales"}', unique_by_payload=True) != hourly  # no period: another key
    bucket = scalar(conn, "SELECT floor(extract(epoch FROM now()) / 3600)::bigint")
    assert scalar(conn, "SELECT idempotency_key FROM courier.queue WHERE id = %s", (hourly,)).endswith(f":{bucket}")


@pytest.mark.parametrize(("options", "field"), [
    ({"unique_by_payload": True, "idempotency_key": "mine"}, "idempotency_key"),
    ({"unique_by_payload": True, "unique_period_seconds": 0}, "unique_period_seconds"),
    ({"unique_by_payload": True, "unique_period_seconds": 31_536_001}, "unique_period_seconds"),
    ({"unique_period_seconds": 60}, "unique_by_payload"),  # a period refines uniqueness by payload
    ({"unique_by_payload": None, "unique_period_seconds": 60}, "unique_by_payload"),
    ({"unique_by_payload": None}, "unique_by_payload"),
])
def test_bad_unique_options_are_refused_naming_the_field(conn, endpoint, options, field):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=field) as refused:
        send(conn, '{"n": 1}', **options)
    assert refused.value.diag.column_name == field


def test_python_and_the_cli_ask_for_uniqueness(courier, conn, endpoint):  # noqa: F811
    first = messages.send(conn, ENDPOINT, {"job": "rebuild"}, SendOptions(unique_by_payload=True))
    conn.commit()
    out = assert_ok(courier("send", ENDPOINT, '{"job": "rebuild"}', "--unique", "-o", "json")).out
    assert json.loads(out)["id"] == first
    out = assert_ok(courier("send", ENDPOINT, '{"job": "x"}', "--unique-period", "86400", "-o", "json")).out
    assert json.loads(out)["id"] != first
    refused = courier("send", ENDPOINT, '[{"job": 1}]', "--batch", "--unique")
    assert refused.code == 2 and "--batch" in refused.err and "Traceback" not in refused.err


def test_the_http_api_asks_for_uniqueness(server, conn, endpoint):  # noqa: F811
    secret = tokens.create_token(conn, "app", topics=[], endpoints=[ENDPOINT], actions=["enqueue"])
    path = f"/api/endpoints/{ENDPOINT}/messages"
    status, first, _ = call(server, "POST", path, secret, {"payload": {"job": 1}, "unique_by_payload": True})
    assert status == 201
    status, again, _ = call(server, "POST", path, secret, {"payload": {"job": 1}, "unique_by_payload": True})
    assert (status, again) == (201, first)
    status, body, _ = call(server, "POST", path, secret, {"payload": {"job": 1}, "unique_by_payload": "yes"})
    assert status == 400 and "unique_by_payload" in json.dumps(body)
    status, body, _ = call(server, "POST", path, secret,
                           {"payload": {"job": 1}, "unique_by_payload": True, "idempotency_key": "k"})
    assert status == 400 and "idempotency_key" in json.dumps(body)
