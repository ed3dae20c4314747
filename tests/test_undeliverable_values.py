"""Values that delivery could never send are refused where they enter (issue 40, item 9): a
header value with a C0 control character (tab aside) or DEL, per message or in an endpoint's
config, and a `signing.secret` that is not base64 after `whsec_`. Before, each was accepted,
and every message carrying it was dead-lettered by the worker. The rules are the HTTP
dispatcher's own: aiohttp's header check and Standard Webhooks' key decoding."""

from __future__ import annotations

import base64
import json

import psycopg
import pytest
from aiohttp import http_writer

from console.workers.dispatchers.http import standard_webhooks_signature
from sqlkit import errors
from tests.test_send_batch_with_options import send as send_batch

SEND = "SELECT courier.send_with_options('webhook', '{}', p_headers := %s::jsonb)"
HOOK = {"url": "https://hooks.example.com/in"}


def refusal(conn: psycopg.Connection, statement: str, params: tuple) -> errors.CourierError:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, params)
    return errors.from_psycopg(caught.value)


def delivery_sends(value: str) -> bool:
    """Whether the HTTP dispatcher's client sends a header with this value."""
    try:
        http_writer._safe_header(value)
    except ValueError:
        return False
    return True


# Every ASCII character and a few beyond, in the middle of a value.
CHARACTERS = [chr(c) for c in range(1, 128)] + ["\x85", "\u2028", "é", "\ufeff"]


@pytest.mark.parametrize("where", ["send", "batch", "create", "alter"])
def test_a_header_value_is_taken_exactly_when_delivery_can_send_it(conn, webhook, where):
    """Each character in a header value: accepted at send (or in an endpoint's config) if and
    only if the dispatcher's HTTP client would send it; a refusal names the header."""
    conn.execute("SELECT courier.create_endpoint('other', 'http', %s::jsonb)", (json.dumps(HOOK),))
    for char in CHARACTERS:
        headers = {"X-Foo": f"a{char}b"}
        if where == "send":
            statement, params, field = SEND, (json.dumps(headers),), "headers.X-Foo"
        elif where == "batch":
            statement = "SELECT courier.send_batch_with_options('webhook', ARRAY['{}', '{}']::jsonb[], " \
                        "p_headers := ARRAY[NULL, %s]::jsonb[])"
            params, field = (json.dumps(headers),), "headers.X-Foo"
        elif where == "create":
            statement = "SELECT courier.create_endpoint('fresh', 'http', %s::jsonb)"
            params, field = (json.dumps({**HOOK, "headers": headers}),), "config.headers.X-Foo"
        else:
            statement = "SELECT courier.alter_endpoint('other', %s::jsonb)"
            params, field = (json.dumps({**HOOK, "headers": headers}),), "config.headers.X-Foo"
        if delivery_sends(headers["X-Foo"]):
            conn.execute(statement, params)
            if where == "create":
                conn.execute("SELECT courier.drop_endpoint('fresh')")
            continue
        error = refusal(conn, statement, params)
        assert (error.sqlstate, error.field) == ("22023", field), (repr(char), error.one_line())
        assert isinstance(error, errors.InvalidInput)
        assert f"U+{ord(char):04X}" in error.message, error.message
        if where == "batch":
            assert "batch element 2" in error.message
    assert conn.execute("SELECT count(*) FROM courier.endpoints WHERE name = 'fresh'").fetchone()[0] == 0


def test_line_breaks_keep_their_message_and_an_empty_header_map_costs_no_check(conn, webhook):
    error = refusal(conn, SEND, (json.dumps({"X-Ok": "a\r\nInjected: 1"}),))
    assert "line break" in error.message and error.field == "headers.X-Ok"
    ids = send_batch(conn, [1, 2], headers=[{}, None])
    assert len(ids) == 2
    assert conn.execute(SEND, ("{}",)).fetchone()[0] > 0
    tab = conn.execute(SEND, (json.dumps({"X-Tab": "a\tb"}),)).fetchone()[0]
    assert conn.execute("SELECT headers FROM courier.queue WHERE id = %s", (tab,)).fetchone()[0] == {"X-Tab": "a\tb"}


def _signed(secret: str) -> dict:
    return {**HOOK, "signing": {"secret": secret}}


GOOD_SECRETS = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_" + base64.b64encode(b"0123456789abcdef").decode(),
                "whsec_YWJj", "whsec_YWI=", "whsec_YQ==", "plain-secret-not-whsec"]
BAD_SECRETS = ["whsec_abc123", "whsec_abc", "whsec_", "whsec_YQ=", "whsec_Y", "whsec_ab-_cd12", "whsec_YWJj!",
               "whsec_YW Jj", "whsec_YQ==YQ==", "whsec_\u00e9\u00e9\u00e9\u00e9"]


@pytest.mark.parametrize("secret", GOOD_SECRETS)
def test_a_signing_secret_delivery_can_use_is_taken(conn, secret):
    standard_webhooks_signature(secret, "msg_1", 1, b"{}")  # delivery's own decoding
    conn.execute("SELECT courier.create_endpoint('signed', 'http', %s::jsonb)", (json.dumps(_signed(secret)),))
    conn.execute("SELECT courier.alter_endpoint('signed', %s::jsonb)", (json.dumps(_signed(secret)),))


@pytest.mark.parametrize("secret", BAD_SECRETS)
def test_a_signing_secret_that_is_not_base64_after_whsec_is_refused_naming_it(conn, secret):
    for statement in ("SELECT courier.create_endpoint('signed', 'http', %s::jsonb)",
                      "SELECT courier.alter_endpoint('webhook', %s::jsonb)"):
        if "alter" in statement:
            conn.execute("SELECT courier.create_endpoint('webhook', 'http', %s::jsonb)", (json.dumps(HOOK),))
        error = refusal(conn, statement, (json.dumps(_signed(secret)),))
        assert (error.sqlstate, error.field) == ("22023", "config.signing.secret"), error.one_line()
        assert "config.signing.secret" in error.message and "base64" in error.message
    assert conn.execute("SELECT config FROM courier.endpoints WHERE name = 'webhook'").fetchone()[0] == HOOK


def test_every_secret_delivery_cannot_decode_is_refused_at_create(conn):
    """The worker's own decoding (which dead-lettered every message when it failed) against
    create_endpoint, for secrets of every length and a few odd characters."""
    candidates = ["whsec_" + "QUJD"[: n % 4] * (n // 4 + 1) + pad for n in range(9) for pad in ("", "=", "==")]
    candidates += [f"whsec_YWJj{odd}" for odd in ("-", "_", ".", " ", "\t", "é")]
    for secret in candidates:
        try:
            standard_webhooks_signature(secret, "msg_1", 1, b"{}")
        except ValueError:
            error = refusal(conn, "SELECT courier.create_endpoint('signed', 'http', %s::jsonb)",
                            (json.dumps(_signed(secret)),))
            assert error.field == "config.signing.secret", secret


@pytest.mark.parametrize(("config", "field"), [
    ({"auth": {"type": "bearer", "token": "abc\x01"}}, "config.auth.token"),
    ({"cloudevents": {"mode": "binary", "type": "order\x7fcreated"}}, "config.cloudevents.type"),
    ({"cloudevents": {"mode": "binary", "source": 5}}, "config.cloudevents.source"),
])
def test_other_config_values_sent_as_header_values_are_checked_too(conn, config, field):
    error = refusal(conn, "SELECT courier.create_endpoint('x', 'http', %s::jsonb)", (json.dumps({**HOOK, **config}),))
    assert (error.sqlstate, error.field) == ("22023", field), error.one_line()
