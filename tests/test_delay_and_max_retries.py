"""Issue 42, items 8 and 9: an endpoint's or topic's delay_seconds (SQS delay queues) makes every
send, enqueue and publish that gives no time of its own due that much later, and wakes no one;
a message's own max_retries overrides the endpoint's retry policy or the topic's max_retries."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from sqlkit import messages, pull, tokens
from sqlkit.errors import InvalidInput
from tests.helpers import claim, leases, message_status, report, scalar
from tests.test_cli import assert_ok, courier  # noqa: F401
from tests.test_serve import call, server, token  # noqa: F401


def endpoint_id(conn: psycopg.Connection, name: str) -> int:
    return scalar(conn, "SELECT id FROM courier.endpoints WHERE name = %s", (name,))


def delay_of(conn: psycopg.Connection, message_id: int) -> float | None:
    """Seconds from the message's creation to its due time (scheduled_at); None: due at once."""
    return scalar(conn, "SELECT extract(epoch FROM scheduled_at - created_at)::float FROM courier.queue WHERE id = %s",
                  (message_id,))


@pytest.fixture
def delayed(conn: psycopg.Connection) -> str:
    """A push endpoint whose messages wait 30 seconds."""
    conn.execute("SELECT courier.create_endpoint('delayed', 'noop', '{\"delay_seconds\": 30}')")
    return "delayed"


@pytest.fixture
def topic(conn: psycopg.Connection) -> str:
    """A pull topic whose messages wait a minute."""
    conn.execute("SELECT courier.create_endpoint('slow', 'pull', '{\"delay_seconds\": 60}')")
    return "slow"


@pytest.fixture
def listener(dsn: str):
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("LISTEN courier_new_msg")
        yield connection


def notified(listener: psycopg.Connection) -> list[str]:
    return [note.payload for note in listener.notifies(timeout=0.5)]


# Item 8: delay_seconds ------------------------------------------------------------------------

def test_every_send_path_delays_a_message_that_gives_no_time_of_its_own(conn, delayed):
    own = datetime.now(UTC) - timedelta(seconds=1)
    single = scalar(conn, "SELECT courier.send('delayed', '{}')")
    with_options = scalar(conn, "SELECT courier.send_with_options('delayed', '{}', p_priority := 3)")
    keyed = scalar(conn, "SELECT courier.send_with_options('delayed', '{}', p_idempotency_key := 'k')")
    scheduled = scalar(conn, "SELECT courier.send_with_options('delayed', '{}', p_scheduled_at := %s)", (own,))
    batch = scalar(conn, "SELECT courier.send_batch('delayed', ARRAY['{}'::jsonb, '{}'])")
    by_priority = scalar(conn, "SELECT courier.send_batch_with_priority('delayed', ARRAY['{}'::jsonb], 5)")
    with_times = scalar(conn, "SELECT courier.send_batch_with_options('delayed', ARRAY['{}'::jsonb, '{}'], "
                              "p_scheduled_at := ARRAY[NULL, %s]::timestamptz[])", (own,))
    for message in [single, with_options, keyed, *batch, *by_priority, with_times[0]]:
        assert delay_of(conn, message) == 30, message
    # A time of its own stands, and so it is the only one due.
    assert scalar(conn, "SELECT scheduled_at FROM courier.queue WHERE id = %s", (scheduled,)) == own
    assert scalar(conn, "SELECT scheduled_at FROM courier.queue WHERE id = %s", (with_times[1],)) == own
    assert sorted(row[0] for row in claim(conn, 100)) == [scheduled, with_times[1]]
    # The TTL runs from the due time, as for any scheduled message.
    conn.execute("SELECT courier.alter_endpoint('delayed', '{\"delay_seconds\": 30, \"message_ttl_seconds\": 10}')")
    late = scalar(conn, "SELECT courier.send('delayed', '{}')")
    assert scalar(conn, "SELECT extract(epoch FROM expires_at - created_at)::int FROM courier.queue WHERE id = %s",
                  (late,)) == 40
    # Once the delay has passed, they are claimed like any other.
    conn.execute("UPDATE courier.queue SET scheduled_at = now() - interval '1 second' WHERE status = 'pending'")
    assert len(claim(conn, 100)) == 8


def test_no_delay_leaves_the_send_due_at_once(conn, webhook, delayed):
    plain = scalar(conn, "SELECT courier.send('webhook', '{}')")
    assert scalar(conn, "SELECT scheduled_at FROM courier.queue WHERE id = %s", (plain,)) is None
    conn.execute("SELECT courier.alter_endpoint('delayed', '{\"delay_seconds\": 0}')")
    undelayed = scalar(conn, "SELECT courier.send('delayed', '{}')")
    assert scalar(conn, "SELECT scheduled_at FROM courier.queue WHERE id = %s", (undelayed,)) is None


def test_a_topic_delays_enqueues_and_sends_and_a_replacement_keeps_its_due_time(conn, topic):
    enqueued = scalar(conn, "SELECT courier.enqueue('slow', '{\"n\": 1}')")
    keyed = scalar(conn, "SELECT courier.enqueue('slow', '{\"n\": 2}', p_key := 'k')")
    sent = scalar(conn, "SELECT courier.send_with_options('slow', '{\"n\": 3}')")
    for message in (enqueued, keyed, sent):
        assert delay_of(conn, message) == 60
        assert scalar(conn, "SELECT visible_at = scheduled_at FROM courier.queue WHERE id = %s", (message,))
    assert conn.execute("SELECT * FROM courier.dequeue('slow', 10)").fetchall() == []
    due = scalar(conn, "SELECT visible_at FROM courier.queue WHERE id = %s", (keyed,))
    assert scalar(conn, "SELECT courier.enqueue('slow', '{\"n\": 4}', p_key := 'k')") == keyed
    assert scalar(conn, "SELECT visible_at FROM courier.queue WHERE id = %s", (keyed,)) == due
    # A message's own time: due at once.
    now = scalar(conn, "SELECT courier.enqueue('slow', '{\"n\": 5}', p_scheduled_at := now())")
    assert [row[0] for row in conn.execute("SELECT id FROM courier.dequeue('slow', 10)")] == [now]


def test_publish_fans_out_with_each_subscriber_s_own_delay(conn, delayed, webhook, topic):
    conn.execute("SELECT courier.create_event_type('order.placed')")
    for endpoint in (delayed, webhook, topic):
        conn.execute("SELECT courier.subscribe('order.placed', %s)", (endpoint,))
    assert scalar(conn, "SELECT courier.publish('order.placed', '{\"n\": 1}')") == 3
    assert scalar(conn, "SELECT courier.publish_batch('order.placed', ARRAY['{\"n\": 2}'::jsonb])") == 3
    delays = conn.execute("SELECT e.name, extract(epoch FROM q.scheduled_at - q.created_at)::float, "
                          "extract(epoch FROM q.visible_at - q.created_at)::float "
                          "FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id "
                          "ORDER BY q.id").fetchall()
    assert sorted(delays) == sorted([("delayed", 30, None), ("webhook", None, None), ("slow", 60, 60)] * 2)


def test_a_delayed_message_wakes_no_one_and_an_undelayed_one_does(conn, listener, delayed, webhook, topic):
    notified(listener)
    conn.execute("SELECT courier.send('delayed', '{}')")
    conn.execute("SELECT courier.send_with_options('delayed', '{}', p_idempotency_key := 'once')")
    conn.execute("SELECT courier.send_batch('delayed', ARRAY['{}'::jsonb])")
    conn.execute("SELECT courier.send_batch_with_options('delayed', ARRAY['{}'::jsonb])")
    conn.execute("SELECT courier.enqueue('slow', '{}')")
    conn.execute("SELECT courier.create_event_type('late')")
    conn.execute("SELECT courier.subscribe('late', 'delayed')")
    conn.execute("SELECT courier.publish('late', '{}')")
    conn.execute("SELECT courier.publish_batch('late', ARRAY['{}'::jsonb])")
    assert notified(listener) == []
    with conn.transaction():
        conn.execute("SELECT courier.send('delayed', '{}')")
        assert scalar(conn, "SELECT current_setting('courier.wake_at_commit')") == "off"
    assert notified(listener) == []

    # Due at once: woken as ever, by its own time or where there is no delay.
    conn.execute("SELECT courier.send('webhook', '{}')")
    assert notified(listener) == [str(endpoint_id(conn, "webhook"))]
    conn.execute("SELECT courier.send_with_options('delayed', '{}', p_scheduled_at := now())")
    assert notified(listener) == [str(endpoint_id(conn, "delayed"))]
    conn.execute("SELECT courier.send_batch_with_options('delayed', ARRAY['{}'::jsonb, '{}'], "
                 "p_scheduled_at := ARRAY[NULL, now()])")
    assert notified(listener) == [str(endpoint_id(conn, "delayed"))]
    conn.execute("SELECT courier.subscribe('late', 'webhook')")
    conn.execute("SELECT courier.publish('late', '{}')")
    assert str(endpoint_id(conn, "webhook")) in notified(listener)


@pytest.mark.parametrize("bad", [901, -1, 1.5, "5", True, 10**20])
def test_a_bad_delay_is_refused_naming_the_field_wherever_config_enters(conn, delayed, topic, bad):
    config = json.dumps({"delay_seconds": bad})
    statements = [("SELECT courier.create_endpoint('other', 'noop', %s)", (config,)),
                  ("SELECT courier.create_endpoint('other', 'pull', %s)", (config,)),
                  ("SELECT courier.alter_endpoint('delayed', %s)", (config,)),
                  ("SELECT courier.alter_topic('slow', %s)", (config,)),
                  ("UPDATE courier.endpoints SET config = %s WHERE name = 'delayed'", (config,))]
    for statement, params in statements:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            conn.execute(statement, params)
        assert "delay_seconds must be a whole number from 0 to 900" in refused.value.diag.message_primary
        assert refused.value.diag.column_name == "delay_seconds"
    # null on a topic reverts to no delay, as for its limits.
    assert scalar(conn, "SELECT courier.alter_topic('slow', '{\"delay_seconds\": null}')") == {}
    assert scalar(conn, "SELECT courier.alter_topic('slow', '{\"delay_seconds\": 900}')") == {"delay_seconds": 900}


# Item 9: a message's own max_retries ------------------------------------------------------------

def fail_until_gone(conn: psycopg.Connection, message: int, limit: int = 20) -> int:
    """Claim and fail the message (retryable) until it leaves the queue; the attempts it took."""
    for attempt in range(1, limit + 1):
        # Only this one is due: the others wait, their attempts untouched.
        conn.execute("UPDATE courier.queue SET next_retry_at = CASE WHEN id = %(id)s THEN now() END, "
                     "scheduled_at = CASE WHEN id <> %(id)s THEN now() + interval '1 hour' END "
                     "WHERE status = 'pending'", {"id": message})
        assert [row[0] for row in claim(conn, 100)] == [message], attempt
        report(conn, [message], ["retryable"], [f"[RETRYABLE] attempt {attempt}"])
        if scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (message,)) == 0:
            return attempt
    raise AssertionError(f"message {message} still queued after {limit} attempts")


def test_a_push_message_s_own_max_retries_overrides_the_retry_policy(conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}', "
                 "'{\"max_retries\": 5, \"backoff\": \"fixed\"}')")
    own = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_max_retries := 1)")
    none = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_max_retries := 0)")
    (batched, policy) = scalar(conn, "SELECT courier.send_batch_with_options('hook', ARRAY['{}'::jsonb, '{}'], "
                                     "p_max_retries := ARRAY[2, NULL])")
    # The claim hands the worker the message's own limit, and the policy's for the rest.
    rows = conn.execute("SELECT id, max_retries FROM courier.claim_batch('w', 10, %s)",
                        (endpoint_id(conn, "hook"),)).fetchall()
    assert dict(rows) == {own: 1, none: 0, batched: 2, policy: 5}
    conn.execute("SELECT courier.release_batch(%s, %s)", (list(dict(rows)), leases(conn, list(dict(rows)))))
    assert fail_until_gone(conn, none) == 1
    assert fail_until_gone(conn, own) == 2
    assert fail_until_gone(conn, batched) == 3
    assert fail_until_gone(conn, policy) == 6  # the policy's 5 retries
    for message in (own, none, batched, policy):
        assert message_status(conn, message) == "failed"
    assert scalar(conn, "SELECT last_error FROM courier.dlq WHERE original_message_id = %s", (own,)) \
        == "[RETRYABLE] attempt 2"


def test_a_pull_message_is_dead_lettered_at_its_own_max_retries(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{\"max_retries\": 5}')")
    own = scalar(conn, "SELECT courier.enqueue('jobs', '{\"n\": 1}', p_max_retries := 1)")
    sent = scalar(conn, "SELECT courier.send_with_options('jobs', '{\"n\": 2}', p_max_retries := 0)")
    topics = scalar(conn, "SELECT courier.enqueue('jobs', '{\"n\": 3}')")
    results: dict[int, list[str]] = {own: [], sent: [], topics: []}
    for _ in range(6):
        rows = conn.execute("SELECT id, lease, max_retries FROM courier.dequeue('jobs', 10)").fetchall()
        for message, lease, limit in rows:
            assert limit == {own: 1, sent: 0, topics: 5}[message]
            (result,) = conn.execute("SELECT result FROM courier.nack(ARRAY[%s]::bigint[], ARRAY[%s], 'no')",
                                     (message, lease)).fetchone()
            results[message].append(result)
    assert results == {own: ["nacked", "dead_lettered"], sent: ["dead_lettered"],
                       topics: ["nacked"] * 5 + ["dead_lettered"]}
    assert scalar(conn, "SELECT count(*) FROM courier.dlq WHERE original_topic = 'jobs'") == 3


def test_a_keyed_replacement_takes_a_new_max_retries_or_keeps_its_own(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    message = scalar(conn, "SELECT courier.enqueue('jobs', '{}', p_key := 'k', p_max_retries := 3)")
    assert scalar(conn, "SELECT courier.enqueue('jobs', '{\"v\": 2}', p_key := 'k')") == message
    assert scalar(conn, "SELECT max_retries FROM courier.queue WHERE id = %s", (message,)) == 3
    scalar(conn, "SELECT courier.enqueue('jobs', '{\"v\": 3}', p_key := 'k', p_max_retries := 7)")
    assert scalar(conn, "SELECT max_retries FROM courier.queue WHERE id = %s", (message,)) == 7


@pytest.mark.parametrize("bad", [-1, 1001])
def test_a_bad_max_retries_is_refused_naming_the_field(conn, webhook, bad):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    for statement in ("SELECT courier.send_with_options('webhook', '{}', p_max_retries := %s)",
                      "SELECT courier.enqueue('jobs', '{}', p_max_retries := %s)"):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            conn.execute(statement, (bad,))
        assert refused.value.diag.message_primary == f"[courier] max_retries must be between 0 and 1000, got {bad}"
        assert refused.value.diag.column_name == "max_retries"
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        conn.execute("SELECT courier.send_batch_with_options('webhook', ARRAY['{}'::jsonb, '{}'], "
                     "p_max_retries := ARRAY[1, %s])", (bad,))
    assert refused.value.diag.message_primary \
        == f"[courier] batch element 2: max_retries must be between 0 and 1000, got {bad}"
    assert refused.value.diag.column_name == "max_retries"
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_the_old_signatures_are_gone_and_applications_may_call_the_new(conn):
    """A parameter added to a function makes an overload: the old signature is dropped, so a call
    that leaves the new parameter out is not ambiguous, and courier_application holds EXECUTE."""
    rows = conn.execute("SELECT p.proname, pg_get_function_identity_arguments(p.oid), "
                        "has_function_privilege('courier_application', p.oid, 'EXECUTE') FROM pg_proc p "
                        "WHERE p.pronamespace = 'courier'::regnamespace "
                        "AND p.proname IN ('send_with_options', 'send_batch_with_options', 'enqueue')").fetchall()
    assert sorted((name, "p_max_retries integer" in arguments, allowed) for name, arguments, allowed in rows) == [
        ("enqueue", True, True), ("send_batch_with_options", True, True), ("send_with_options", True, True)]


def test_the_python_wrappers_take_max_retries(conn, webhook):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    sent = messages.send(conn, "webhook", {"n": 1}, messages.SendOptions(max_retries=2))
    enqueued = pull.enqueue(conn, "jobs", {"n": 2}, max_retries=4)
    assert dict(conn.execute("SELECT id, max_retries FROM courier.queue")) == {sent: 2, enqueued: 4}
    with pytest.raises(InvalidInput) as refused:
        pull.enqueue(conn, "jobs", {}, max_retries=1001)
    assert refused.value.field == "max_retries"


# The CLI and HTTP surfaces --------------------------------------------------------------------

def test_the_cli_sends_and_enqueues_with_max_retries_and_sets_a_topic_s_delay(conn, courier, webhook):  # noqa: F811
    sent = assert_ok(courier("send", "webhook", '{"n": 1}', "--max-retries", "2", "--json")).json()["id"]
    assert assert_ok(courier("topic", "create", "jobs", "--delay-seconds", "45", "--json")).json()["config"] \
        == {"delay_seconds": 45}
    enqueued = assert_ok(courier("enqueue", "jobs", '{"n": 2}', "--max-retries", "3", "--json")).json()["id"]
    assert dict(conn.execute("SELECT id, max_retries FROM courier.queue")) == {sent: 2, enqueued: 3}
    assert delay_of(conn, enqueued) == 45
    assert assert_ok(courier("topic", "alter", "jobs", "--delay-seconds", "0", "--json")).json()["config"] \
        == {"delay_seconds": 0}

    refused = courier("send", "webhook", "{}", "--max-retries", "1001")
    assert refused.code == 2 and "--max-retries" in refused.err
    refused = courier("enqueue", "jobs", "{}", "--max-retries", "-1")
    assert refused.code == 2 and "--max-retries" in refused.err
    refused = courier("topic", "alter", "jobs", "--delay-seconds", "901")
    assert refused.code == 2 and "--delay-seconds" in refused.err
    refused = courier("send", "webhook", "[1]", "--batch", "--max-retries", "1")
    assert refused.code == 2 and "--batch takes only --priority" in refused.err
    refused = courier("endpoint", "create", "later", "noop", '{"delay_seconds": 1000}')
    assert refused.code != 0 and "delay_seconds" in refused.err


def test_http_enqueue_and_send_take_max_retries_and_refuse_a_bad_one_naming_it(server, conn, webhook):  # noqa: F811
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    secret = token(conn, "app", ["enqueue"])
    status, body, _ = call(server, "POST", "/api/messages", secret, {"topic": "jobs", "payload": "e30=",
                                                                     "max_retries": 2})
    assert status == 201
    enqueued = int(body["id"])
    status, body, _ = call(server, "POST", "/api/messages/batch", secret,
                           {"messages": [{"topic": "jobs", "payload": "e30=", "max_retries": 5}]})
    assert status == 201
    batched = int(body["ids"][0])
    pusher = tokens.create_token(conn, "pusher", topics=[], endpoints=["webhook"], actions=["enqueue"])
    status, body, _ = call(server, "POST", "/api/endpoints/webhook/messages", pusher,
                           {"payload": {"n": 1}, "max_retries": 0})
    assert status == 201, body
    sent = int(body["id"])
    assert dict(conn.execute("SELECT id, max_retries FROM courier.queue")) == {enqueued: 2, batched: 5, sent: 0}

    for bad in (1001, -1, "3", 2.5):
        status, body, _ = call(server, "POST", "/api/messages", secret,
                               {"topic": "jobs", "payload": "e30=", "max_retries": bad})
        assert (status, body["field"]) == (400, "max_retries"), body
    status, body, _ = call(server, "POST", "/api/messages/batch", secret,
                           {"messages": [{"topic": "jobs", "payload": "e30=", "max_retries": 1001}]})
    assert (status, body["field"]) == (400, "messages[0].max_retries")
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 3
    # The OpenAPI description says so too.
    status, spec, _ = call(server, "GET", "/api/openapi.json")
    assert status == 200
    assert "max_retries" in json.dumps(spec)
