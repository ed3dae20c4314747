"""Client errors are 4xx, never a 500 with a traceback in the log (issue 40, item 8): a lone low
surrogate in a text field, digits that are not 0-9 in an id, a body whose Content-Encoding
cannot be decoded, a push endpoint's name where a pull topic's belongs; and a header value
HTTP cannot carry, refused at send over HTTP as over SQL (item 9). Each against a real
`courier serve` on loopback; the `server` fixture fails the test on a traceback in its log."""
# ruff: noqa: F811  (the `server` and `orders` fixtures come from test_serve, by import)

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any

import aiohttp
import pytest

from console.serve import input as serve_input
from sqlkit import errors, tokens
from tests.test_serve import b64, call, orders, server, token  # noqa: F401


def raw_call(base: str, method: str, path: str, secret: str, body: bytes,
             headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    """A request with the body sent as given (no JSON encoding by the client, no decompression)."""
    async def go() -> tuple[int, Any, dict[str, str]]:
        sent = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json", **(headers or {})}
        async with aiohttp.ClientSession(auto_decompress=False) as session, session.request(
                method, base + path, data=body, headers=sent) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None, dict(response.headers)
    return asyncio.run(go())


def test_a_lone_surrogate_in_any_text_field_is_a_400_naming_it(server, conn, orders):
    app = token(conn, "app", ["enqueue", "consume"])
    cases = [
        ("/api/messages", b'{"topic": "orders", "payload": "eA==", "key": "\\udc00"}', "key"),
        ("/api/messages", b'{"topic": "orders", "payload": "eA==", "key": "a\\uDFFFb"}', "key"),
        ("/api/messages", b'{"topic": "\\udc00", "payload": "eA=="}', "topic"),
        ("/api/messages", b'{"topic": "orders", "payload": "eA==", "metadata": {"k": ["\\ude00"]}}',
         "metadata.k[0]"),
        ("/api/messages/batch", b'{"messages": [{"topic": "orders", "payload": "eA==", "key": "\\udc00"}]}',
         "messages[0].key"),
        ("/api/messages/1/nack", b'{"receipt": "AAAAAAAAAAEAAAAB", "error": "\\udc00"}', "error"),
        ("/api/messages/nack", b'{"messages": [], "error": "\\udfff"}', "error"),
        ("/api/messages/dequeue", b'{"topic": "\\udc01"}', "topic"),
    ]
    for path, body, field in cases:
        status, answer, _ = raw_call(server, "POST", path, app, body)
        assert (status, answer.get("field")) == (400, field), (path, body, answer)
        assert "surrogate" in answer["message"]


def test_a_body_that_is_not_utf_8_is_a_400(server, conn, orders):
    """The UTF-8 spelling of a lone surrogate, raw in the body (not escaped): Python's JSON
    reader took it for the surrogate, and the dequeue failed with a 500 (found by the fuzz test)."""
    app = token(conn, "app", ["enqueue", "consume"])
    for body in (b'{"topic": "\xd9\xa1=\xed\xbf\xbf\xed\xb0\x80"}', b'{"topic": "\xff"}'):
        status, answer, _ = raw_call(server, "POST", "/api/messages/dequeue", app, body)
        assert (status, answer["error"]) == (400, "invalid"), answer


@pytest.mark.parametrize("digit", ["\u00b9", "\u0661", "\uff11", "\u2460"])
def test_an_id_of_digits_that_are_not_0_to_9_is_a_400(server, conn, orders, digit):
    """str.isdigit() takes ¹ (int() then raised: a 500) and Arabic-Indic digits (int() read them)."""
    app = token(conn, "app", ["enqueue", "consume"])
    admin = token(conn, "admin", ["admin"])
    status, answer, _ = call(server, "POST", f"/api/messages/{digit}/requeue", admin)
    assert (status, answer["field"]) == (400, "id"), answer
    status, answer, _ = call(server, "POST", "/api/messages/ack", app,
                             {"messages": [{"id": f"1{digit}", "receipt": "AAAAAAAAAAEAAAAB"}]})
    assert (status, answer["field"]) == (400, "messages[0].id"), answer
    assert serve_input.digits("id", "123") == 123
    with pytest.raises(Exception, match="message id"):
        serve_input.digits("id", digit)


@pytest.mark.parametrize("encoding", ["deflate", "gzip"])
def test_a_body_whose_content_encoding_is_corrupt_is_a_400_and_the_connection_closes(server, conn, orders,
                                                                                   encoding):
    app = token(conn, "app", ["enqueue", "consume"])
    good = json.dumps({"topic": "orders", "payload": b64(1)}).encode()
    packed = zlib.compress(good) if encoding == "deflate" else gzip.compress(good)
    for body in (b"not compressed at all", packed[:-6] + b"\x00" * 6):
        status, answer, headers = raw_call(server, "POST", "/api/messages", app, body,
                                           {"Content-Encoding": encoding})
        assert (status, answer["error"]) == (400, "invalid"), answer
        assert answer["message"] == f"the body cannot be read: Can not decode content-encoding: {encoding}"
        assert headers.get("Connection", "").lower() == "close"
    # Cut short: the stream ends early (the parser refuses it, or what decodes is not JSON).
    status, answer, _ = raw_call(server, "POST", "/api/messages", app, packed[: len(packed) // 2],
                                 {"Content-Encoding": encoding})
    assert status == 400, answer
    # A good one is decoded and taken; the server is still answering.
    status, answer, _ = raw_call(server, "POST", "/api/messages", app, packed, {"Content-Encoding": encoding})
    assert status == 201, answer
    assert call(server, "GET", "/api/topics/orders", app)[0] == 200


def test_a_push_endpoints_name_where_a_topic_belongs_is_a_400_naming_the_topic(server, conn, orders):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    app = token(conn, "app", ["enqueue", "consume"])
    admin = token(conn, "admin", ["admin"])
    for secret, method, path, body in [
        (app, "POST", "/api/messages", {"topic": "hook", "payload": b64(1)}),
        (app, "POST", "/api/messages/batch", {"messages": [{"topic": "hook", "payload": b64(1)}]}),
        (app, "POST", "/api/messages/dequeue", {"topic": "hook"}),
        (app, "POST", "/api/messages/dequeue", {"topic": "hook", "wait_seconds": 0.2}),
        (admin, "PUT", "/api/topic-configs/hook", {"max_retries": 1}),
        (admin, "DELETE", "/api/topic-configs/hook", None),
    ]:
        status, answer, _ = call(server, method, path, secret, body)
        assert status in (400, 404), (path, body, answer)
        if status == 400:
            assert answer["field"] == "topic" and "not a pull topic" in answer["message"], answer
    assert call(server, "GET", "/api/topic-configs/hook", admin)[0] == 404


@pytest.mark.parametrize(("sqlstate", "status"), [
    ("22023", 400), ("22004", 400), ("22P02", 400), ("22003", 400), ("23505", 409), ("23503", 400),
    ("42710", 409), ("P0002", 404), ("42704", 404), ("55000", 409), ("55006", 409), ("55P03", 409),
    ("42501", 403), ("42809", 400), ("0A000", 400), ("53400", 429), ("53401", 429), ("54000", 413),
    ("40001", 503), ("40P01", 503), ("57014", 503), ("57P01", 503), ("53300", 503), ("53100", 503),
    ("25006", 503), ("08006", 503), ("3D000", 503), ("58030", 503),
])
def test_every_sqlstate_the_api_raises_is_a_4xx_or_503(sqlstate, status):
    """The SQL API's own codes (grep ERRCODE sqlkit/functions), and PostgreSQL's under load,
    failover or a bad value: none is a 500."""
    from console.serve.problems import from_courier_error

    class Diag:
        message_primary = "[courier] refused"
        message_hint = None
        column_name = "headers.X-Foo"

    class Failure(Exception):
        pass

    failure = Failure("refused")
    failure.sqlstate, failure.diag = sqlstate, Diag()  # type: ignore[attr-defined]
    error = errors.from_psycopg(failure)  # type: ignore[arg-type]
    problem = from_courier_error(error)
    assert problem.status == status, (sqlstate, type(error).__name__)
    if status < 500 and status != 429 and sqlstate != "42501":
        assert problem.body["field"] == "headers.X-Foo"


def test_a_header_value_http_cannot_carry_is_refused_at_send_naming_it(server, conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    producer = tokens.create_token(conn, "producer", topics=[], endpoints=["billing"], actions=["enqueue"])
    for value in ("a\x01b", "a\x7fb", "a\x1bb", "line\nbreak", "a\x0bb"):
        status, answer, _ = call(server, "POST", "/api/endpoints/billing/messages", producer,
                                 {"payload": 1, "headers": {"X-Foo": value}})
        assert (status, answer.get("field")) == (400, "headers.X-Foo"), (value, answer)
    status, answer, _ = call(server, "POST", "/api/endpoints/billing/messages", producer,
                             {"payload": 1, "headers": {"X-Foo": "tab\there, é"}})
    assert status == 201, answer
    assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 1


def test_the_header_map_checker_for_the_push_route():
    """input.header_map: what push.py's `headers` field should use (the SQL refusal stands behind it)."""
    assert serve_input.header_map("headers", {"X-Ok": "a\tb"}) == {"X-Ok": "a\tb"}
    for value, field in [({"X-Foo": "a\x01"}, "headers.X-Foo"), ({"X Foo": "a"}, "headers.X Foo"),
                         ({"X-Foo": 1}, "headers.X-Foo"), ([], "headers")]:
        with pytest.raises(Exception) as caught:
            serve_input.header_map("headers", value)
        assert caught.value.body["field"] == field
