"""Bad input gets a clear error and leaves nothing behind."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.helpers import queue_rows, scalar


def endpoints_count(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT count(*) FROM courier.endpoints")


def test_unknown_endpoint(conn, webhook):
    with pytest.raises(psycopg.errors.NoDataFound, match='endpoint "nope" does not exist'):
        conn.execute("SELECT courier.send('nope', '{}')")
    with pytest.raises(psycopg.errors.NoDataFound):
        conn.execute("SELECT courier.send_batch('nope', ARRAY['{}'::jsonb])")
    assert queue_rows(conn) == 0


def test_disabled_endpoint(conn, webhook):
    conn.execute("SELECT courier.disable_endpoint('webhook')")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match='"webhook" is disabled'):
        conn.execute("SELECT courier.send('webhook', '{}')")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        conn.execute("SELECT courier.send_batch('webhook', ARRAY['{}'::jsonb])")
    assert queue_rows(conn) == 0


def test_malformed_json(conn, webhook):
    with pytest.raises(psycopg.errors.InvalidTextRepresentation, match="invalid input syntax for type json"):
        conn.execute("SELECT courier.send('webhook', '{\"order\": 1')")
    assert queue_rows(conn) == 0


def test_null_payload(conn, webhook):
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        conn.execute("SELECT courier.send('webhook', NULL)")
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="batch element 2 is NULL"):
        conn.execute("SELECT courier.send_batch('webhook', ARRAY['{}'::jsonb, NULL])")
    assert queue_rows(conn) == 0


def test_payload_over_the_size_limit(conn, webhook):
    conn.execute("SELECT courier.set_setting('max_payload_size', '2048')")
    big = '{"blob": "' + "x" * 5000 + '"}'
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="exceeds max_payload_size"):
        conn.execute("SELECT courier.send('webhook', %s::jsonb)", (big,))
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="batch element 2"):
        conn.execute("SELECT courier.send_batch('webhook', ARRAY['{}'::jsonb, %s::jsonb])", (big,))
    assert queue_rows(conn) == 0


@pytest.mark.parametrize("priority", [11, -1])
def test_priority_out_of_range(conn, webhook, priority):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="priority must be between 0 and 10"):
        conn.execute("SELECT courier.send_with_options('webhook', '{}'::jsonb, p_priority := %s)", (priority,))
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT courier.send_batch_with_priority('webhook', ARRAY['{}'::jsonb], %s)", (priority,))
    assert queue_rows(conn) == 0


@pytest.mark.parametrize(("name", "value", "message"), [
    ("max_queue_size", "-1", "out of range"),
    ("circuit_breaker_threshold", "0", "out of range"),
    ("circuit_breaker_cooldown", "3601", "out of range"),
    ("stale_recovery_timeout", "59", "out of range"),
    ("retry_base_delay", "ten", "must be a whole number"),
    ("http_allow_internal_urls", "maybe", "must be true or false"),
])
def test_setting_out_of_range(conn, name, value, message):
    before = scalar(conn, "SELECT courier.get_setting(%s)", (name,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute("SELECT courier.set_setting(%s, %s)", (name, value))
    assert scalar(conn, "SELECT courier.get_setting(%s)", (name,)) == before


def test_unknown_setting(conn):
    with pytest.raises(psycopg.errors.UndefinedObject, match='unknown setting "max_queue"'):
        conn.execute("SELECT courier.set_setting('max_queue', '5')")


@pytest.mark.parametrize("name", [
    "billing'; DROP TABLE courier.queue; --",
    "x\" OR 1=1 --",
    "../../etc/passwd",
    "",
    "a b",
    "x" * 129,
])
def test_injection_shaped_endpoint_names_are_refused(conn, webhook, name):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid endpoint name"):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    with pytest.raises(psycopg.errors.NoDataFound):
        conn.execute("SELECT courier.send(%s, '{}')", (name,))
    assert endpoints_count(conn) == 1
    assert scalar(conn, "SELECT to_regclass('courier.queue') IS NOT NULL")


@pytest.mark.parametrize("url", [
    "ftp://example.com/hook",
    "file:///etc/passwd",
    "javascript:alert(1)",
    "example.com/hook",
    "http://",
    "http://exa mple.com/",
])
def test_url_must_be_http_or_https(conn, url):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="is not a valid URL"):
        conn.execute("SELECT courier.create_endpoint('hook', 'http', jsonb_build_object('url', %s::text))", (url,))
    assert endpoints_count(conn) == 0


@pytest.mark.parametrize("config", [
    {"url": "http://admin:hunter2@x.test/hook", "headers": {"Authorization": "Bearer a"}},
    {"url": "http://x.test/hook", "headers": {"authorization": "Bearer a"}, "auth": {"type": "bearer", "token": "b"}},
    {"url": "https://u:p@x.test/hook", "auth": {"type": "basic", "username": "u", "password": "p"}},
])
def test_credentials_given_twice_are_refused_at_create(conn, config):
    """The HTTP client refuses a request with two sources of credentials, so every message of
    such an endpoint failed; the config is refused where it enters, without echoing it."""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="gives credentials twice") as raised:
        conn.execute("SELECT courier.create_endpoint('hook', 'http', %s)", (Jsonb(config),))
    assert "hunter2" not in str(raised.value)
    assert endpoints_count(conn) == 0
    one = {"url": "http://u:p@x.test/hook"}  # one source alone is fine
    conn.execute("SELECT courier.create_endpoint('hook', 'http', %s)", (Jsonb(one),))


def test_http_endpoint_needs_a_url(conn):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='needs "url"'):
        conn.execute("SELECT courier.create_endpoint('hook', 'http', '{}')")


def test_unknown_config_key_is_named(conn):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"unknown key.*ulr"):
        conn.execute("SELECT courier.create_endpoint('hook', 'http', '{\"ulr\": \"http://x.test/\"}')")


@pytest.mark.parametrize("policy", [
    '{"backoff": "quadratic"}',
    '{"max_retries": -1}',
    '{"max_retries": "ten"}',
    '{"base_delay_seconds": 0}',
    '{"retries": 3}',
    '[1, 2]',
])
def test_malformed_retry_policy(conn, policy):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="retry_policy"):
        conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}', %s::jsonb)", (policy,))
    assert endpoints_count(conn) == 0


@pytest.mark.parametrize("rate_limit", ['{"rate": -5}', '{"rate": 10, "burst": 0}', '"fast"'])
def test_negative_or_malformed_rate_limit(conn, rate_limit):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="rate_limit"):
        conn.execute("SELECT courier.create_endpoint('hook', 'noop', jsonb_build_object('rate_limit', %s::jsonb))",
                     (rate_limit,))


def test_duplicate_endpoint_name(conn, webhook):
    with pytest.raises(psycopg.errors.DuplicateObject, match="already exists"):
        conn.execute("SELECT courier.create_endpoint('webhook', 'noop', '{}')")


def test_unknown_protocol(conn):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="unknown protocol"):
        conn.execute("SELECT courier.create_endpoint('hook', 'smtp', '{}')")


def test_reserved_dlq_suffix(conn):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="reserved"):
        conn.execute("SELECT courier.create_endpoint('orders.dlq', 'pull', '{}')")


def test_alter_validates_before_changing_anything(conn, webhook):
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT courier.alter_endpoint('webhook', '{\"url\": \"gopher://x\"}')")
    assert scalar(conn, "SELECT config->>'url' FROM courier.endpoints") == "http://127.0.0.1:9000/hook"


def test_drop_refuses_while_messages_are_active(conn, webhook):
    conn.execute("SELECT courier.send('webhook', '{}')")
    with pytest.raises(psycopg.errors.ObjectInUse, match="still has 1 active message"):
        conn.execute("SELECT courier.drop_endpoint('webhook')")
    conn.execute("SELECT courier.drop_endpoint('webhook', p_force := true)")
    assert queue_rows(conn) == 0 and endpoints_count(conn) == 0


@pytest.mark.parametrize(("statement", "fragment"), [
    ("UPDATE courier.endpoints SET retry_policy = '{\"base_delay_seconds\": \"ten\"}'", "base_delay_seconds"),
    ("UPDATE courier.endpoints SET retry_policy = '{\"backoff\": \"random\"}'", "backoff"),
    ("UPDATE courier.endpoints SET config = config || '{\"rate_limit\": {\"rate\": -1}}'", "rate"),
    ("UPDATE courier.endpoints SET config = '{\"url\": \"ftp://x\"}'", "url"),
    ("INSERT INTO courier.endpoints (name, protocol, config) VALUES ('raw', 'http', '{}')", "url"),
])
def test_direct_table_changes_are_validated_like_the_api(conn, statement, fragment):
    """ulak's docs change retry policies with a plain UPDATE; a bad one must not get in that way."""
    conn.execute("SELECT courier.create_endpoint('hook', 'http', '{\"url\": \"https://example.com/hook\"}')")
    before = conn.execute("SELECT config, retry_policy FROM courier.endpoints").fetchall()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=fragment):
        conn.execute(statement)
    assert conn.execute("SELECT config, retry_policy FROM courier.endpoints").fetchall() == before
    conn.execute("UPDATE courier.endpoints SET retry_policy = '{\"backoff\": \"linear\", \"max_retries\": 20}'")
