"""Issue 40: `courier serve` against hostile and unlucky clients. A malformed or oversized
request is answered in JSON like every other error, and neither the answer nor the server's log
holds the token it carried (item 2); a port in use is one line and exit code 1 (item 10); a slow
client is let go at --client-timeout, refusals are logged one line each and no more than a few a
second, and /readyz names no database address to anyone (the low items). Real `courier serve`
processes on loopback, spoken to over raw sockets."""

# ruff: noqa: F811  (the `orders` fixture comes from test_serve, by import)
from __future__ import annotations

import io
import json
import logging
import socket
import subprocess
import time

import pytest

from console.logs import REDACTED_AT_SOURCE, JsonLineFormatter, RedactingFilter, redact_at_source
from sqlkit import tokens
from sqlkit.redaction import redact_shapes, redact_text, scrub
from tests.tcp_proxy import PostgresProxy
from tests.test_serve import COURIER, call, free_port, orders, start_server, stop_server, token  # noqa: F401


def exchange(port: int, request: bytes, timeout: float = 10) -> bytes:
    """Send a raw request; everything the server answers until it closes the connection."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as client:
        client.sendall(request)
        try:
            while chunk := client.recv(65536):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return received


def split(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def leaks(text: str | bytes, secret: str) -> bool:
    """Whether text holds the secret, or any 12 characters of its random part in a row."""
    text = text.decode("latin-1") if isinstance(text, bytes) else text
    body = secret[len(tokens.PREFIX):]
    return any(body[i:i + 12] in text for i in range(len(body) - 11))


def malformed(secret: str) -> dict[str, tuple[bytes, set[int]]]:
    """Requests aiohttp's parser refuses (or, with no scheme, Courier's authentication), each
    carrying the token's secret, with the statuses each may be answered with."""
    s = secret.encode()
    head = b"GET /api/topics HTTP/1.1\r\nHost: courier\r\nConnection: close\r\n"
    return {
        "oversized header": (head + b"Authorization: Bearer " + s + b"x" * 9000 + b"\r\n\r\n", {400, 431}),
        "oversized header, secret first": (head + b"Authorization: Bearer " + s + b" " + b"x" * 9000 + b"\r\n\r\n",
                                           {400, 431}),
        "oversized custom header": (head + b"X-Api-Key: " + s + b"x" * 9000 + b"\r\n\r\n", {400, 431}),
        "oversized request line": (b"GET /api/topics?token=" + s + b"x" * 9000 + b" HTTP/1.1\r\n\r\n",
                                   {400, 414, 431}),
        "folded header": (head + b"Authorization:\r\n Bearer " + s + b"\r\n\r\n", {400}),
        "tab before the colon": (head + b"Authorization\t: Bearer " + s + b"\r\n\r\n", {400}),
        "space before the colon": (head + b"Authorization : Bearer " + s + b"\r\n\r\n", {400}),
        "no colon": (head + s + b"\r\n\r\n", {400}),
        "no scheme": (head + b"Authorization: " + s + b"\r\n\r\n", {401}),
        "basic, malformed": (head + b"Authorization: Basic " + s + b"\r\n\r\n", {401}),
    }


def test_malformed_requests_are_answered_in_json_and_no_secret_reaches_the_client_or_the_log(dsn, conn):
    secret = token(conn, "app", ["enqueue"])
    process, base = start_server(dsn)
    port = int(base.rsplit(":", 1)[1])
    answers = {}
    try:
        for name, (request, statuses) in malformed(secret).items():
            answer = exchange(port, request)
            answers[name] = answer
            status, headers, body = split(answer)
            assert status in statuses, (name, answer[:300])
            assert headers["content-type"].startswith("application/json"), (name, answer[:300])
            problem = json.loads(body)  # the shape of every error (console/serve/problems.py)
            assert set(problem) <= {"error", "message", "field"} and problem["error"] and problem["message"], name
            assert not leaks(answer, secret), (name, answer)
        # The server is none the worse: a good request still succeeds.
        assert call(base, "GET", "/healthz")[0] == 200
    finally:
        log = stop_server(process)
    assert not leaks(log, secret), log
    assert "Traceback" not in log
    lines = log.splitlines()
    assert all(json.loads(line) for line in lines), log  # aiohttp's records too: every line is JSON
    refused = [json.loads(line) for line in lines if "refused" in line]
    assert len(refused) == len(answers) and all("remote" in line for line in refused), log


def test_a_port_in_use_is_one_line_and_exit_code_1(dsn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([str(COURIER), "serve", "--listen", f"127.0.0.1:{port}", "--dsn", dsn],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert done.stdout == ""
    assert "serving" not in done.stderr and "Traceback" not in done.stderr
    error = done.stderr.strip()
    assert len(error.splitlines()) == 1, error
    assert error.startswith("error: ") and f"127.0.0.1:{port}" in error and "already in use" in error, error


def _seconds_until_closed(port: int, request: bytes, trickle: bytes, limit: float = 15) -> float:
    """Send request, then `trickle` every 0.2 s: how long until the server closed the connection."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=0.2) as slow:
        slow.sendall(request)
        while time.monotonic() - began < limit:
            try:
                if slow.recv(4096) == b"":
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                break
            try:
                slow.sendall(trickle)
            except OSError:
                break
    return time.monotonic() - began


def test_a_slow_client_is_let_go_at_the_client_timeout(dsn, conn, orders):
    """A body that trickles in is answered 408 at --client-timeout, and the connection closed
    then, not after aiohttp's 10 s of lingering; so is one refused (401) before its body came."""
    secret = token(conn, "app", ["enqueue"])
    process, base = start_server(dsn, "--client-timeout", "1")
    port = int(base.rsplit(":", 1)[1])
    try:
        start = (b"POST /api/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100000\r\n")
        assert _seconds_until_closed(port, start + b"Authorization: Bearer " + secret.encode() + b"\r\n\r\n{",
                                     b" ") < 3.5
        assert _seconds_until_closed(port, start + b"\r\n{", b" ") < 3.5
    finally:
        assert "Traceback" not in stop_server(process)


def test_refusals_are_one_line_each_and_a_flood_of_them_a_few(dsn, orders):
    process, base = start_server(dsn)
    port = int(base.rsplit(":", 1)[1])
    try:
        for n in range(40):
            assert split(exchange(port, b"GET /api/topics HTTP/1.1\r\nHost: x\r\nBad\t: header\r\n\r\n"))[0] == 400
            assert call(base, "GET", "/api/topics", f"courier_{n:043d}")[0] == 401
    finally:
        log = stop_server(process)
    assert "Traceback" not in log
    refused = [json.loads(line) for line in log.splitlines() if "refused" in line]
    assert 1 <= len(refused) <= 10, log  # 80 refusals in well under the 10 s window


@pytest.fixture
def proxy(dsn):
    proxy = PostgresProxy(dsn)
    yield proxy
    proxy.close()


def test_readyz_names_no_database_address_but_the_log_does(proxy):
    process, base = start_server(proxy.proxied_dsn)
    try:
        assert call(base, "GET", "/readyz")[:2] == (200, {"status": "ready"})
        proxy.cut()
        status, body, _ = call(base, "GET", "/readyz")
        proxy.restore()
    finally:
        log = stop_server(process)
    assert status == 503 and body["status"] == "unavailable"
    assert body["reason"].startswith("database unreachable") and str(proxy.port) not in body["reason"]
    assert "Traceback" not in log
    detail = [json.loads(line) for line in log.splitlines() if "not ready" in line]
    assert len(detail) == 1 and "cannot connect" in detail[0]["error"], log
    assert str(proxy.port) in log  # the operator's log says where it tried


SECRET = tokens.PREFIX + "Zq9sEcReT0Zq9sEcReT0Zq9sEcReT0Zq9sEcReT0abc"
SHAPES = [
    (f"b'Bearer {SECRET}AAAA...'", "b'Bearer ***'"),
    (f"Invalid header token:\\n\\n  b'{SECRET}'", "Invalid header token:\\n\\n  b'courier_***'"),
    (f"{SECRET[:36]}...", "courier_***..."),  # cut short in a quote, 28 of its 43 characters
    ("signing with whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw=", "signing with whsec_***"),
    ("Basic YXBwOmNvdXJpZXJfc2VjcmV0", "Basic ***"),
    ("bearer abcdefgh.ijk-lmn", "bearer ***"),
]
NOT_SECRETS = ["courier_t_0123456789ab", "courier_orders", "courier.serve", "send a token: Authorization: Bearer "
               "<token>, or basic auth as <name>:<token>", 'Bearer realm="courier", Basic realm="courier"',
               "the token is unknown or revoked"]
DSNS = [("postgresql://courier:pa55:w@rd@db.internal:5432/courier", "postgresql://courier:***@db.internal:5432/courier"),
        ("host=db port=5432 user=courier password=pa55w0rd dbname=courier",
         "host=db port=5432 user=courier password=*** dbname=courier")]


@pytest.mark.parametrize(("text", "expected"), SHAPES)
def test_secrets_are_redacted_by_their_shape(text, expected):
    assert redact_shapes(text) == expected and redact_shapes(expected) == expected
    assert not any(part in scrub(text) for part in (SECRET[8:20], "MfKQ9r8G", "YXBwOmNv", "abcdefgh"))


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_what_only_looks_near_a_secret_is_left_alone_in_error_bodies(text):
    assert redact_shapes(text) == text


@pytest.mark.parametrize(("text", "expected"), DSNS)
def test_dsn_passwords_are_redacted(text, expected):
    assert redact_text(text) == expected and scrub(text) == expected


def test_the_token_prefix_is_the_shape_redacted():
    assert tokens.PREFIX == "courier_"  # sqlkit/redaction.py SHAPE_RULES spells it out


def test_no_handler_logs_a_secret_from_aiohttp(monkeypatch):
    """aiohttp's parser errors, as aiohttp.server logs them, through the JSON lines and through
    a plain handler someone else added: neither shows the secret."""
    from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

    json_out, plain_out = io.StringIO(), io.StringIO()
    json_handler, plain_handler = logging.StreamHandler(json_out), logging.StreamHandler(plain_out)
    json_handler.setFormatter(JsonLineFormatter())
    json_handler.addFilter(RedactingFilter())
    plain_handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [json_handler, plain_handler])
    for name in REDACTED_AT_SOURCE:
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    redact_at_source()
    server = logging.getLogger("aiohttp.server")
    for error in (LineTooLong(b"Bearer " + SECRET.encode() + b"x" * 50, 8190),
                  BadHttpMessage(f"Invalid header value char:\n\n  b' Bearer {SECRET}'\n     ^")):
        try:
            raise error
        except BadHttpMessage:
            server.exception("Error handling request from %s (%s)", "127.0.0.1", SECRET)
    written = json_out.getvalue() + plain_out.getvalue()
    assert "Error handling request from 127.0.0.1" in plain_out.getvalue()
    assert "LineTooLong" in written and SECRET[len(tokens.PREFIX):][:12] not in written, written
    assert all(json.loads(line) for line in json_out.getvalue().splitlines())
