"""Publish/subscribe: event types, filtered subscriptions, and publish/publish_batch fanning
out into courier.queue for push endpoints and pull topics alike."""

from __future__ import annotations

import psycopg
import pytest

from tests import test_roles_and_psql
from tests.helpers import queue_rows, scalar
from tests.test_cli import run as cli
from tests.test_roles_and_psql import psql

login_as = test_roles_and_psql.login_as  # the fixture, for tests here that log in as a role

HOOK = '{"url": "https://hooks.example/hook"}'


@pytest.fixture
def orders(conn: psycopg.Connection) -> str:
    """Event type order.created, subscribed by billing (eu only), audit (everything) and
    shipping (express eu orders), three HTTP endpoints."""
    for name in ("billing", "audit", "shipping"):
        conn.execute("SELECT courier.create_endpoint(%s, 'http', %s)", (name, HOOK))
    conn.execute("SELECT courier.create_event_type('order.created', 'An order was placed')")
    conn.execute("""SELECT courier.subscribe('order.created', 'billing', '{"region": "eu"}')""")
    conn.execute("SELECT courier.subscribe('order.created', 'audit')")
    conn.execute("""SELECT courier.subscribe('order.created', 'shipping', '{"region": "eu", "tags": ["express"]}')""")
    return "order.created"


def fanned_out(conn: psycopg.Connection) -> list[tuple[str, int]]:
    return conn.execute("SELECT e.name, (q.payload ->> 'id')::int FROM courier.queue q "
                        "JOIN courier.endpoints e ON e.id = q.endpoint_id ORDER BY q.id").fetchall()


def test_publish_fans_out_to_every_subscription_whose_filter_matches(conn, orders):
    assert scalar(conn, """SELECT courier.publish('order.created',
                           '{"id": 1, "region": "eu", "tags": ["express", "gift"]}')""") == 3
    assert scalar(conn, """SELECT courier.publish('order.created', '{"id": 2, "region": "eu"}')""") == 2
    assert scalar(conn, """SELECT courier.publish('order.created', '{"id": 3, "region": "us"}')""") == 1

    assert fanned_out(conn) == [("billing", 1), ("audit", 1), ("shipping", 1),
                                ("billing", 2), ("audit", 2), ("audit", 3)]
    # Every copy of one event shares a correlation id and says where it came from.
    copies = conn.execute("SELECT correlation_id, metadata ->> 'event_type', status FROM courier.queue "
                          "WHERE payload ->> 'id' = '1'").fetchall()
    assert len({c[0] for c in copies}) == 1 and copies[0][0] is not None
    assert {(c[1], c[2]) for c in copies} == {("order.created", "pending")}


def test_publish_batch_fans_out_each_event_in_one_call(conn, orders):
    with conn.cursor() as cur:
        cur.execute("LISTEN courier_new_msg")
    count = scalar(conn, """SELECT courier.publish_batch('order.created',
        ARRAY['{"id": 1, "region": "eu"}', '{"id": 2, "region": "us"}', '{"id": 3, "region": "eu"}']::jsonb[])""")
    assert count == 5
    assert fanned_out(conn) == [("billing", 1), ("audit", 1), ("audit", 2), ("billing", 3), ("audit", 3)]
    # One NOTIFY for each subscriber that got messages, at commit.
    notes = list(conn.notifies(timeout=0.5, stop_after=5))
    subscribers = conn.execute("SELECT id::text FROM courier.endpoints WHERE name IN ('billing', 'audit')").fetchall()
    assert sorted(n.payload for n in notes) == sorted(row[0] for row in subscribers)
    # Each event of the batch has its own correlation id.
    assert scalar(conn, "SELECT count(DISTINCT correlation_id) FROM courier.queue") == 3


def test_publish_with_no_matching_subscription_queues_nothing(conn, orders):
    conn.execute("SELECT courier.unsubscribe('order.created', 'audit')")
    assert scalar(conn, """SELECT courier.publish('order.created', '{"id": 1, "region": "us"}')""") == 0
    assert queue_rows(conn) == 0


def test_disabled_subscriber_is_skipped_and_others_still_get_the_event(conn, orders):
    conn.execute("SELECT courier.disable_endpoint('billing')")
    assert scalar(conn, """SELECT courier.publish('order.created', '{"id": 1, "region": "eu"}')""") == 1
    assert fanned_out(conn) == [("audit", 1)]


def test_projected_fan_out_over_max_queue_size_rejects_the_whole_publish(conn, orders):
    conn.execute("SELECT courier.set_setting('max_queue_size', '4')")
    conn.execute("""SELECT courier.publish('order.created', '{"id": 1, "region": "us"}')""")  # 1 queued
    # 1 + 3 fits exactly.
    assert scalar(conn, """SELECT courier.publish('order.created',
                           '{"id": 2, "region": "eu", "tags": ["express"]}')""") == 3
    conn.execute("DELETE FROM courier.queue WHERE payload ->> 'id' = '2'")  # back to 1 active

    # A batch of two eu events projects 4 messages: 1 + 4 > 4, so none are inserted,
    # although the first event alone (2 messages) would have fit.
    with pytest.raises(psycopg.errors.ConfigurationLimitExceeded, match="fan-out of 4 would exceed max_queue_size 4"):
        conn.execute("""SELECT courier.publish_batch('order.created',
                        ARRAY['{"id": 3, "region": "eu"}', '{"id": 4, "region": "eu"}']::jsonb[])""")
    assert fanned_out(conn) == [("audit", 1)]


def test_idempotency_key_is_carried_per_subscription(conn, orders):
    event = '{"id": 7, "region": "eu"}'
    assert scalar(conn, "SELECT courier.publish('order.created', %s, p_idempotency_key := 'order-7')", (event,)) == 2
    # The retry of the same publish finds the event queued for both and adds nothing.
    assert scalar(conn, "SELECT courier.publish('order.created', %s, p_idempotency_key := 'order-7')", (event,)) == 2
    assert fanned_out(conn) == [("billing", 7), ("audit", 7)]
    assert scalar(conn, "SELECT array_agg(DISTINCT idempotency_key) FROM courier.queue") == ["order-7"]

    # A subscriber added since then gets it on the retry; the others still hold theirs.
    conn.execute("SELECT courier.create_endpoint('crm', 'http', %s)", (HOOK,))
    conn.execute("SELECT courier.subscribe('order.created', 'crm')")
    assert scalar(conn, "SELECT courier.publish('order.created', %s, p_idempotency_key := 'order-7')", (event,)) == 3
    assert fanned_out(conn) == [("billing", 7), ("audit", 7), ("crm", 7)]

    # The same key with another payload is a conflict, and nothing of that publish is kept.
    with pytest.raises(psycopg.errors.UniqueViolation, match="same key with different payload"):
        conn.execute("""SELECT courier.publish('order.created', '{"id": 8, "region": "eu"}',
                        p_idempotency_key := 'order-7')""")
    assert queue_rows(conn) == 3

    # Delivered and archived, the key still turns the event away for that subscriber for
    # idempotency_retention_seconds, as a send with the key would; with no retention it is free.
    conn.execute("UPDATE courier.queue SET status = 'completed', completed_at = now() - interval '1 minute' "
                 "WHERE endpoint_id = (SELECT id FROM courier.endpoints WHERE name = 'crm')")
    assert scalar(conn, "SELECT courier.archive_completed_messages(0, 100)") == 1
    assert scalar(conn, "SELECT courier.publish('order.created', %s, p_idempotency_key := 'order-7')", (event,)) == 3
    assert queue_rows(conn) == 2
    conn.execute("SELECT courier.set_setting('idempotency_retention_seconds', '0')")
    assert scalar(conn, "SELECT courier.publish('order.created', %s, p_idempotency_key := 'order-7')", (event,)) == 3
    assert queue_rows(conn) == 3


def test_subscribe_again_is_idempotent_and_a_new_filter_is_refused(conn, orders):
    first = scalar(conn, """SELECT courier.subscribe('order.created', 'billing', '{"region": "eu"}')""")
    assert scalar(conn, """SELECT courier.subscribe('order.created', 'billing', '{"region": "eu"}')""") == first
    with pytest.raises(psycopg.errors.UniqueViolation, match="already subscribed"):
        conn.execute("""SELECT courier.subscribe('order.created', 'billing', '{"region": "us"}')""")
    assert scalar(conn, "SELECT courier.unsubscribe('order.created', 'billing')") is True
    assert scalar(conn, "SELECT courier.unsubscribe('order.created', 'billing')") is False
    assert scalar(conn, """SELECT courier.subscribe('order.created', 'billing', '{"region": "us"}')""") != first


@pytest.mark.parametrize(("statement", "error", "message"), [
    ("SELECT courier.publish('order.shipped', '{}')", psycopg.errors.NoDataFound,
     'event type "order.shipped" does not exist'),
    ("SELECT courier.publish('order.created', NULL)", psycopg.errors.NullValueNotAllowed, "payload must not be NULL"),
    ("SELECT courier.publish_batch('order.created', ARRAY['{}', NULL]::jsonb[])",
     psycopg.errors.NullValueNotAllowed, "batch element 2 is NULL"),
    ("SELECT courier.publish('order.created', '{}', p_idempotency_key := '')", psycopg.errors.InvalidParameterValue,
     "idempotency key must be 1 to 255"),
    ("SELECT courier.subscribe('order.created', 'billing', '[1]')", psycopg.errors.InvalidParameterValue,
     "filter must be a JSON object, not array"),
    ("SELECT courier.subscribe('order.created', 'nowhere')", psycopg.errors.NoDataFound,
     'endpoint "nowhere" does not exist'),
    ("SELECT courier.subscribe('nothing', 'billing')", psycopg.errors.NoDataFound,
     'event type "nothing" does not exist'),
    ("SELECT courier.create_event_type('order.created')", psycopg.errors.DuplicateObject, "already exists"),
    ("SELECT courier.create_event_type('bad name!')", psycopg.errors.InvalidParameterValue,
     "invalid event type name"),
    ("SELECT courier.drop_event_type('order.created')", psycopg.errors.ObjectInUse, "still has 3 subscription"),
], ids=["unknown-type", "null-payload", "null-element", "empty-key", "array-filter", "unknown-endpoint",
        "unknown-type-subscribe", "duplicate-type", "bad-type-name", "drop-in-use"])
def test_bad_input_is_refused_with_a_clear_error(conn, orders, statement, error, message):
    with pytest.raises(error, match=message):
        conn.execute(statement)
    assert queue_rows(conn) == 0


def test_payload_over_max_payload_size_is_refused(conn, orders):
    conn.execute("SELECT courier.set_setting('max_payload_size', '1024')")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="batch element 2 exceeds max_payload_size"):
        conn.execute("SELECT courier.publish_batch('order.created', ARRAY['{}', %s]::jsonb[])",
                     ('{"blob": "' + "x" * 2000 + '"}',))
    assert queue_rows(conn) == 0


def test_dropping_an_endpoint_or_event_type_takes_its_subscriptions(conn, orders):
    conn.execute("SELECT courier.drop_endpoint('shipping')")
    assert scalar(conn, "SELECT count(*) FROM courier.subscriptions") == 2
    assert scalar(conn, "SELECT courier.drop_event_type('order.created', p_force := true)") is True
    assert scalar(conn, "SELECT count(*) FROM courier.subscriptions") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.event_log WHERE event_type = 'event_type.dropped'") == 1


def test_application_role_publishes_through_psql_but_cannot_manage_subscriptions(dsn, conn, orders, login_as):
    app = login_as("courier_application")
    app_dsn = app.info.dsn
    published = psql(app_dsn, """SELECT courier.publish('order.created', '{"id": 1, "region": "eu"}')""",
                     """SELECT courier.publish_batch('order.created', ARRAY['{"id": 2}']::jsonb[])""")
    assert published.returncode == 0, published.stderr
    assert published.stdout.split() == ["2", "1"]
    assert fanned_out(conn) == [("billing", 1), ("audit", 1), ("audit", 2)]

    for statement in ("SELECT courier.create_event_type('mine')", "SELECT courier.drop_event_type('order.created')",
                      "SELECT courier.subscribe('order.created', 'billing')",
                      "SELECT courier.unsubscribe('order.created', 'audit')",
                      "SELECT * FROM courier.subscriptions"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute(statement)
    assert scalar(conn, "SELECT count(*) FROM courier.subscriptions") == 3


def test_admin_manages_event_types_and_monitor_only_reads_them(conn, login_as):
    admin = login_as("courier_admin")
    admin.execute("SELECT courier.create_endpoint('billing', 'noop')")
    admin.execute("SELECT courier.create_event_type('invoice.paid')")
    admin.execute("""SELECT courier.subscribe('invoice.paid', 'billing', '{"currency": "EUR"}')""")
    monitor = login_as("courier_monitor")
    assert monitor.execute("SELECT e.name, s.endpoint_id FROM courier.subscriptions s "
                           "JOIN courier.event_types e ON e.id = s.event_type_id").fetchall() == [("invoice.paid", 1)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        monitor.execute("SELECT courier.publish('invoice.paid', '{}')")


# The CLI, run as a user runs it ------------------------------------------------------------

def test_cli_creates_subscribes_and_publishes(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'http', %s)", (HOOK,))
    conn.execute("SELECT courier.create_endpoint('audit', 'noop')")
    assert cli("event-type", "create", "order.created", "--description", "An order was placed", dsn=dsn).code == 0
    assert cli("subscribe", "order.created", "billing", "--filter", '{"region": "eu"}', dsn=dsn).code == 0
    assert cli("subscribe", "order.created", "audit", dsn=dsn).code == 0

    published = cli("publish", "order.created", '{"id": 42, "region": "eu"}', "--json", dsn=dsn)
    assert published.code == 0 and published.json() == {"event_type": "order.created", "queued": 2}
    batch = cli("publish", "order.created", "--batch", dsn=dsn, stdin='{"id": 1}\n{"id": 2, "region": "eu"}\n')
    assert batch.code == 0 and "2 order.created event(s): 3 message(s) queued" in batch.text
    assert fanned_out(conn) == [("billing", 42), ("audit", 42), ("audit", 1), ("billing", 2), ("audit", 2)]

    listed = cli("event-type", "list", "--json", dsn=dsn).json()
    assert [(t["name"], t["subscriptions"]) for t in listed] == [
        ("order.created", [{"endpoint": "audit", "filter": {}}, {"endpoint": "billing", "filter": {"region": "eu"}}])]

    assert cli("unsubscribe", "order.created", "billing", dsn=dsn).code == 0
    assert cli("event-type", "drop", "order.created", dsn=dsn).code == 1
    declined = cli("event-type", "drop", "order.created", "--force", dsn=dsn, stdin="n\n")
    assert declined.code == 1 and "remove all of its subscriptions?" in declined.out  # asks first, as redrive does
    assert scalar(conn, "SELECT count(*) FROM courier.event_types") == 1
    assert cli("event-type", "drop", "order.created", "--force", "--yes", dsn=dsn).code == 0
    assert scalar(conn, "SELECT count(*) FROM courier.event_types") == 0


@pytest.mark.parametrize(("args", "code", "message"), [
    (("publish", "nope", "{}"), 1, 'error: event type "nope" does not exist (SQLSTATE P0002)'),
    (("publish", "order.created", "{bad"), 2, "Invalid value for PAYLOAD: not valid JSON"),
    (("subscribe", "order.created", "billing", "--filter", "[1]"), 2, "--filter: must be a JSON object"),
    (("subscribe", "order.created", "nowhere"), 1, 'error: endpoint "nowhere" does not exist'),
    (("event-type", "create", "bad name"), 1, "error: invalid event type name"),
    (("publish", "order.created", "{}", "--batch", "--idempotency-key", "k"), 2, "--batch takes no"),
], ids=["unknown-type", "bad-json", "array-filter", "unknown-endpoint", "bad-name", "batch-with-key"])
def test_cli_bad_arguments_give_one_readable_line(dsn, orders, args, code, message):
    done = cli(*args, dsn=dsn)
    assert done.code == code
    assert message in " ".join(done.err.split())
    assert "Traceback" not in done.err


def test_cli_unreachable_database_is_one_line(orders):
    done = cli("publish", "order.created", "{}", dsn="postgresql://postgres@127.0.0.1:1/nowhere")
    assert done.code == 1 and done.err.startswith("error: cannot connect to PostgreSQL")


# Pull topics ----------------------------------------------------------------------------------

def test_publish_reaches_pull_topics_and_push_endpoints_alike(conn, orders):
    conn.execute("""SELECT courier.create_endpoint('warehouse', 'pull', '{"message_ttl_seconds": 3600}')""")
    conn.execute("""SELECT courier.subscribe('order.created', 'warehouse', '{"region": "eu"}')""")
    conn.execute("""SELECT courier.publish_batch('order.created',
                    ARRAY['{"id": 1, "region": "eu"}', '{"id": 2, "region": "us"}']::jsonb[])""")
    assert fanned_out(conn) == [("billing", 1), ("audit", 1), ("warehouse", 1), ("audit", 2)]

    # The topic's TTL applies to what is published to it, as to what is enqueued.
    ttl = scalar(conn, "SELECT q.expires_at - q.created_at FROM courier.queue q JOIN courier.endpoints e "
                       "ON e.id = q.endpoint_id WHERE e.name = 'warehouse'")
    assert ttl.total_seconds() == pytest.approx(3600, abs=5)
    # A consumer of the topic dequeues it with a lease and acks it; the push copies are untouched.
    taken = conn.execute("SELECT id, lease, payload ->> 'id', metadata ->> 'event_type' "
                         "FROM courier.dequeue('warehouse', 10, 30)").fetchall()
    assert [(t[2], t[3]) for t in taken] == [("1", "order.created")]
    assert conn.execute("SELECT result FROM courier.ack(%s, %s)", ([taken[0][0]], [taken[0][1]])).fetchall() \
        == [("acked",)]
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 3
    # And a destructive receive takes the next one.
    conn.execute("""SELECT courier.publish('order.created', '{"id": 3, "region": "eu"}')""")
    assert conn.execute("SELECT payload ->> 'id' FROM courier.receive('warehouse', 5)").fetchall() == [("3",)]


def test_a_topic_at_its_max_depth_rejects_the_whole_publish(conn, orders):
    conn.execute("""SELECT courier.create_endpoint('warehouse', 'pull', '{"max_depth": 2}')""")
    conn.execute("SELECT courier.subscribe('order.created', 'warehouse')")
    conn.execute("""SELECT courier.publish('order.created', '{"id": 1, "region": "us"}')""")  # audit + warehouse
    with pytest.raises(psycopg.Error, match='"warehouse" is full: 1 pending/processing') as refused:
        conn.execute("""SELECT courier.publish_batch('order.created',
                        ARRAY['{"id": 2, "region": "us"}', '{"id": 3, "region": "us"}']::jsonb[])""")
    assert refused.value.sqlstate == "53401"
    assert fanned_out(conn) == [("audit", 1), ("warehouse", 1)]
    # One more fits.
    assert scalar(conn, """SELECT courier.publish('order.created', '{"id": 4, "region": "us"}')""") == 2


def test_a_push_endpoint_at_its_max_depth_rejects_the_publish_too(conn, orders):
    conn.execute("""SELECT courier.alter_endpoint('audit', %s)""",
                 ('{"url": "https://hooks.example/hook", "max_depth": 1}',))
    conn.execute("""SELECT courier.publish('order.created', '{"id": 1, "region": "us"}')""")
    with pytest.raises(psycopg.Error, match='"audit" is full') as refused:
        conn.execute("""SELECT courier.publish('order.created', '{"id": 2, "region": "eu"}')""")
    assert refused.value.sqlstate == "53401"
    assert fanned_out(conn) == [("audit", 1)]


def test_cli_publish_batch_names_the_input_line_of_a_refused_event(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('audit', 'noop')")
    conn.execute("SELECT courier.set_setting('max_payload_size', '1024')")
    assert cli("event-type", "create", "order.created", dsn=dsn).code == 0
    assert cli("subscribe", "order.created", "audit", dsn=dsn).code == 0
    big = '{"pad": "' + "x" * 2000 + '"}'
    refused = cli("publish", "order.created", "--batch", dsn=dsn, stdin=f'{{"id": 1}}\n\n{big}\n')
    assert refused.code == 1 and "stdin line 3: batch element 2" in refused.err, refused.err
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
