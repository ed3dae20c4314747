"""A table of bad input, across the SQL API, plain table writes, the CLI and settings: each case
gets a clear error (message and SQLSTATE, or exit code) and leaves nothing written."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests import test_roles_and_psql
from tests.helpers import scalar
from tests.test_cli import run

login_as = test_roles_and_psql.login_as  # the fixture: logs in as a new member of a role

HTTP = "SELECT courier.create_endpoint('bad', 'http', %s::jsonb)"
URL = "https://hooks.example.com/in"


def http(**config: object) -> str:
    return json.dumps({"url": URL, **config})


def policy(**keys: object) -> tuple[str, tuple[str]]:
    return ("SELECT courier.create_endpoint('bad', 'noop', '{}', %s::jsonb)", (json.dumps(keys),))


# (statement, params, SQLSTATE, words the message must hold)
SQL_CASES = [
    # 11. every config key checked for type and range, unknown keys refused by name
    (HTTP, (http(allow_internal="false"),), "22023", "allow_internal must be true or false"),
    (HTTP, (http(allow_internal=1),), "22023", "allow_internal must be true or false"),
    (HTTP, (http(capture_response="yes"),), "22023", "capture_response must be true or false"),
    (HTTP, (http(auto_disable_on_gone="true"),), "22023", "auto_disable_on_gone must be true or false"),
    (HTTP, (http(concurrency=2.5),), "22023", "concurrency must be a whole number"),
    (HTTP, (http(concurrency=0),), "22023", "concurrency must be a whole number"),
    (HTTP, (http(timeout="10"),), "22023", "timeout must be a number"),
    (HTTP, (http(timeout=301),), "22023", "timeout must be a number"),
    (HTTP, (http(method=5),), "22023", "method must be"),
    (HTTP, (http(method="TRACE"),), "22023", "method must be"),
    (HTTP, (http(headers=["x"]),), "22023", "headers must be a JSON object"),
    (HTTP, (http(headers={"X-A": 1}),), "22023", "must have a string value"),
    (HTTP, (http(headers={"X-A": "a\r\nInjected: 1"}),), "22023", "line break"),
    (HTTP, (http(headers={"Host": "evil"}),), "22023", "set by Courier"),
    (HTTP, (http(surprise=True),), "22023", "unknown key(s): surprise"),
    (HTTP, (json.dumps({"url": "https://hooks.example.com:99999/in"}),), "22023", "outside 1-65535"),
    (HTTP, (json.dumps({"url": "https://hooks.example.com:0/in"}),), "22023", "outside 1-65535"),
    (HTTP, (json.dumps({"url": "ftp://hooks.example.com/in"}),), "22023", "not a valid URL"),
    (HTTP, (json.dumps({"url": 42}),), "22023", "needs \"url\" (a string)"),
    (HTTP, ("{}",), "22023", "needs \"url\""),
    (HTTP, (http(auth={"type": "bearer"}),), "22023", "needs \"token\""),
    (HTTP, (http(auth={"type": "basic", "username": "u", "password": ""}),), "22023", "password must be a non-empty"),
    (HTTP, (http(signing={"secret": 5}),), "22023", "secret must be a non-empty string"),
    (HTTP, (http(cloudevents={"mode": "both"}),), "22023", "cloudevents must be"),
    (HTTP, (http(rate_limit={"rate": "fast"}),), "22023", "rate_limit.rate must be a number"),
    (HTTP, (http(rate_limit={"rate": 1, "burst": 0}),), "22023", "rate_limit.burst must be a number"),
    (HTTP, (http(rate_limit={"rate": 1, "per": "s"}),), "22023", "unknown key(s): per"),
    ("SELECT courier.create_endpoint('bad', 'mqtt', %s::jsonb)",
     (json.dumps({"url": "mqtt://b:1883", "topic": "t", "qos": 1.0}),), "22023", "qos must be a whole number"),
    ("SELECT courier.create_endpoint('bad', 'mqtt', %s::jsonb)",
     (json.dumps({"url": "mqtt://b:1883", "topic": "t", "retain": "no"}),), "22023", "retain must be true or false"),
    ("SELECT courier.create_endpoint('bad', 'amqp', %s::jsonb)",
     (json.dumps({"url": "amqp://b", "routing_key": "k", "persistent": 1}),), "22023", "persistent must be true"),
    ("SELECT courier.create_endpoint('bad', 'redis', %s::jsonb)",
     (json.dumps({"url": "redis://b", "stream": "s", "maxlen": 10.5}),), "22023", "maxlen must be a whole number"),
    ("SELECT courier.create_endpoint('bad', 'pull', %s::jsonb)",
     (json.dumps({"max_retries": 3.0}),), "22023", "max_retries must be a whole number"),
    ("SELECT courier.create_endpoint('bad', 'gopher', '{}')", (), "22023", "unknown protocol"),
    (*policy(max_retries=2.5), "22023", "max_retries must be a whole number"),
    (*policy(max_retries=3.0), "22023", "max_retries must be a whole number"),
    (*policy(max_retries="3"), "22023", "max_retries must be a whole number"),
    (*policy(max_retries=-1), "22023", "max_retries must be a whole number"),
    (*policy(max_retries=1001), "22023", "max_retries must be a whole number"),
    (*policy(base_delay_seconds=0), "22023", "base_delay_seconds must be a whole number"),
    (*policy(max_delay_seconds=1e9), "22023", "max_delay_seconds must be a whole number"),
    (*policy(backoff="random"), "22023", "backoff must be exponential, linear or fixed"),
    (*policy(jitter=True), "22023", "unknown key(s): jitter"),
    # endpoint names
    ("SELECT courier.create_endpoint('orders.dlq', 'noop')", (), "22023", "reserved"),
    ("SELECT courier.create_endpoint('bad name', 'noop')", (), "22023", "invalid endpoint name"),
    ("SELECT courier.create_endpoint('x''; DROP TABLE courier.queue; --', 'noop')", (), "22023",
     "invalid endpoint name"),
    # 14. per-message headers
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"Content-Length": "1"}',), "22023", "set by Courier"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"Transfer-Encoding": "chunked"}',), "22023", "set by Courier"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"host": "internal"}',), "22023", "set by Courier"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"User-Agent": "x"}',), "22023", "set by Courier"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"X-Courier-Attempt": "9"}',), "22023", "set by Courier"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"X-Ok": "a\\nb"}',), "22023", "line break"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"X-Ok": "a\\rb"}',), "22023", "line break"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"X Bad": "a"}',), "22023", "not a valid HTTP header name"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"X-Num": 7}',), "22023", "must have a string value"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := %s::jsonb)",
     ('{"X-Obj": {"a": "b"}}',), "22023", "must have a string value"),
    # 6. nesting
    ("SELECT courier.send_with_options('hook', '{}', p_metadata := (repeat('{\"a\":', 40) || '1' || "
     "repeat('}', 40))::jsonb)", (), "22023", "nested more than 32 levels"),
    # 12. the size limit is on what is delivered
    ("SELECT courier.send('hook', jsonb_build_object('blob', repeat('a', 2000000)))", (), "54000",
     "exceeds max_payload_size"),
    ("SELECT courier.send_batch('hook', ARRAY[jsonb_build_object('blob', repeat('a', 2000000))])", (), "54000",
     "exceeds max_payload_size"),
    # read from a table, the same 2 MB payload is a 23 kB compressed datum: it passed before
    ("CREATE TEMP TABLE big AS SELECT jsonb_build_object('blob', repeat('a', 2000000)) AS j; "
     "SELECT courier.send('hook', j) FROM big", (), "54000", "exceeds max_payload_size"),
    ("CREATE TEMP TABLE big AS SELECT jsonb_build_object('blob', repeat('a', 2000000)) AS j; "
     "SELECT courier.send_batch('hook', ARRAY(SELECT j FROM big))", (), "54000", "exceeds max_payload_size"),
    # priorities and keys
    ("SELECT courier.send_with_options('hook', '{}', p_priority := 11)", (), "22023", "priority"),
    ("SELECT courier.send_with_options('hook', '{}', p_ordering_key := '')", (), "22023", "1 to 255 characters"),
    ("SELECT courier.send_with_options('hook', '{}', p_idempotency_key := repeat('k', 256))", (), "22023",
     "1 to 255 characters"),
    ("SELECT courier.send_with_options('hook', '{}', p_headers := '[]')", (), "22023", "must be JSON objects"),
    # settings
    ("SELECT courier.set_setting('max_queue_size', '-1')", (), "22023", "out of range"),
    ("SELECT courier.set_setting('max_queue_size', '2.5')", (), "22023", "must be a whole number"),
    ("SELECT courier.set_setting('http_allow_internal_urls', 'maybe')", (), "22023", "must be true or false"),
    ("SELECT courier.set_setting('no_such', '1')", (), "42704", "unknown setting"),
]


def _snapshot(conn: psycopg.Connection) -> tuple:
    return conn.execute(
        "SELECT (SELECT count(*) FROM courier.endpoints), (SELECT count(*) FROM courier.queue),"
        " (SELECT string_agg(name || '=' || value, ',' ORDER BY name) FROM courier.settings),"
        " (SELECT string_agg(name || config::text || retry_policy::text, ',' ORDER BY id) FROM courier.endpoints)"
    ).fetchone()


@pytest.fixture
def hook(conn) -> None:
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")


@pytest.mark.parametrize(("statement", "params", "sqlstate", "words"), SQL_CASES,
                         ids=[f"sql-{n:02d}" for n in range(len(SQL_CASES))])
def test_bad_sql_input_is_refused_by_name_and_writes_nothing(conn, hook, statement, params, sqlstate, words):
    before = _snapshot(conn)
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, params or None)
    assert caught.value.sqlstate == sqlstate, caught.value
    assert words in str(caught.value), str(caught.value)
    assert _snapshot(conn) == before


# 10. Plain table writes get the API's checks -------------------------------------------------

TABLE_CASES = [
    ("UPDATE courier.endpoints SET name = 'hook.dlq'", "22023", "reserved"),
    ("UPDATE courier.endpoints SET name = 'bad name'", "22023", "invalid endpoint name"),
    ("INSERT INTO courier.endpoints (name, protocol, config) VALUES ('x.dlq', 'noop', '{}')", "22023", "reserved"),
    ("UPDATE courier.endpoints SET config = '{\"concurrency\": 1.5}'", "22023", "concurrency must be a whole"),
    ("UPDATE courier.endpoints SET retry_policy = '{\"max_retries\": 3.0}'", "22023", "max_retries must be a whole"),
    ("UPDATE courier.endpoints SET protocol = 'gopher'", "22023", "unknown protocol"),
    ("UPDATE courier.settings SET value = '-5' WHERE name = 'max_queue_size'", "22023", "out of range"),
    ("UPDATE courier.settings SET value = 'sometimes' WHERE name = 'capture_response'", "22023",
     "must be true or false"),
]


@pytest.mark.parametrize(("statement", "sqlstate", "words"), TABLE_CASES,
                         ids=[f"table-{n:02d}" for n in range(len(TABLE_CASES))])
def test_plain_table_writes_by_an_admin_get_the_apis_checks(conn, hook, login_as, statement, sqlstate, words):
    admin = login_as("courier_admin")
    before = _snapshot(conn)
    with pytest.raises(psycopg.Error) as caught:
        admin.execute(statement)
    assert caught.value.sqlstate == sqlstate and words in str(caught.value), caught.value
    assert _snapshot(conn) == before


def test_an_admin_cannot_change_what_a_setting_is(conn, login_as):
    admin = login_as("courier_admin")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only migrations"):
        admin.execute("UPDATE courier.settings SET max_value = 99999999999 WHERE name = 'max_queue_size'")
    admin.execute("UPDATE courier.settings SET value = ' 500 ' WHERE name = 'max_queue_size'")  # a value is fine
    assert scalar(conn, "SELECT value FROM courier.settings WHERE name = 'max_queue_size'") == "500"


# CLI: exit code 2 for usage errors, 1 for refused input, one line, nothing written -----------

CLI_CASES = [
    (["send", "hook", "{\"a\": 1"], 2, "not valid JSON"),
    (["send", "hook", "{}", "--priority", "11"], 2, "11"),
    (["send", "nope", "{}"], 1, "does not exist"),
    (["endpoint", "create", "x.dlq", "noop"], 1, "reserved"),
    (["config", "set", "max_queue_size", "-1"], 1, "out of range"),
    (["config", "set", "no_such", "1"], 1, "unknown setting"),
    (["send", "hook", "{}", "--delay", "1e300"], 2, "--delay"),
    (["send", "hook", "[" * 5_000 + "]" * 5_000], 2, "nested too deeply"),
    (["send", "hook", "{}", "--delay", "nan"], 2, "not a finite number"),
    (["send", "hook", "{}", "--ttl", "nan"], 2, "not a finite number"),
    (["send", "hook", "{}", "--ttl", "1e300"], 2, "--ttl"),
    (["send", "hook", "{\"a\": NaN}"], 2, "NaN is not a JSON number"),
    (["send", "hook", "{\"a\": -Infinity}"], 2, "-Infinity is not a JSON number"),
    (["send", "hook", "--batch", "[{\"a\": Infinity}]"], 2, "Infinity is not a JSON number"),
    (["send", "hook", "{}", "--metadata", "{\"a\":" * 40 + "1" + "}" * 40], 1, "nested more than 32 levels"),
    (["worker", "--poll-interval", "nan"], 2, "not a finite number"),
    (["events", "--interval", "nan"], 2, "not a finite number"),
    # Bytes that are not UTF-8 (Python makes surrogates of them) and NUL characters: psycopg failed
    # to send them with a traceback, or PostgreSQL refused them naming nothing.
    (["send", "hook", "{}", "--ordering-key", b"k\xff"], 2, "'k\\xff' is not UTF-8 text"),
    (["send", "hook", b'{"a": "\xff"}'], 2, "a is not UTF-8 text"),
    (["send", "hook", '{"a": {"b": "\\u0000"}}'], 2, "a.b holds a NUL character"),
    (["send", "hook", '{"a": "\\ud83d"}'], 2, "a is not UTF-8 text"),
    (["topic", "create", b"t\xff"], 2, "'t\\xff' is not UTF-8 text"),
]


@pytest.mark.parametrize(("args", "code", "words"), CLI_CASES, ids=[f"cli-{n:02d}" for n in range(len(CLI_CASES))])
def test_bad_cli_input_exits_with_one_clear_line(dsn, conn, hook, args, code, words):
    before = _snapshot(conn)
    result = run(*args, dsn=dsn)
    assert result.code == code, result
    text = (result.out + result.err).strip()
    assert words in text and "Traceback" not in text, text
    assert _snapshot(conn) == before


@pytest.mark.parametrize("args", [["send", "hook"], ["send", "hook", "--batch"], ["publish", "order.paid"]])
def test_a_payload_file_that_is_not_utf8_exits_with_one_clear_line(dsn, conn, hook, tmp_path, args):
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"name": "Zoë"}'.encode("latin-1"))
    before = _snapshot(conn)
    result = run(*args, "--file", str(latin1), dsn=dsn)
    text = (result.out + result.err).strip()
    assert result.code == 2 and "not UTF-8 text: byte 0xeb at position 12" in text and "Traceback" not in text, result
    assert _snapshot(conn) == before
