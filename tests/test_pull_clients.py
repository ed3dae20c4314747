"""Pull topics from outside Python's sqlkit: a psql client running the whole cycle, a consumer
process killed mid-message, what each role may do, and the CLI as a user types it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from tests.helpers import scalar
from tests.test_cli import assert_ok, assert_one_line_error, courier  # noqa: F401 (fixture)
from tests.test_roles_and_psql import login_as, psql, rows  # noqa: F401 (fixture)


@pytest.fixture
def orders(conn) -> str:
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 1}')""")
    return "orders"


def test_a_psql_client_runs_the_whole_cycle(dsn, conn, orders):
    script = r"""
\set ON_ERROR_STOP 1
SELECT courier.enqueue('orders', '{"id": 42}', 'order-42') AS first \gset
SELECT courier.enqueue('orders', '{"id": 43}', 'order-42') = :first AS same_id;
SELECT courier.enqueue('orders', '{"id": 7}') AS second \gset
SELECT courier.peek('orders');
SELECT id, lease FROM courier.dequeue('orders', 1, 60) \gset held_
SELECT :held_id = :first AS fifo, courier.ack(:held_id, :held_lease);
SELECT id, lease FROM courier.dequeue('orders', 1, 60) \gset held_
SELECT courier.nack(:held_id, :held_lease, 'upstream 500');
SELECT id, lease FROM courier.dequeue('orders', 1, 60) \gset held_
SELECT courier.nack(:held_id, :held_lease, 'upstream 500 again');
SELECT id FROM courier.dlq WHERE original_topic = 'orders' \gset dead_
SELECT courier.requeue(:dead_id) AS requeued \gset
SELECT id = :requeued, payload FROM courier.receive('orders', 10);
SELECT count(*) FROM courier.receive('orders', 10);
"""
    done = psql(dsn, stdin=script)
    assert done.returncode == 0, done.stderr
    assert rows(done.stdout) == [["t"], ["2"], ["t", "acked"], ["nacked"], ["dead_lettered"],
                                 ["t", '{"id": 7}'], ["0"]]


CONSUMER = """
import sys, time, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    row = conn.execute("SELECT id, lease FROM courier.dequeue('orders', 1, 2)").fetchone()
    print(row[0], row[1], flush=True)
    time.sleep(600)  # working on it... until SIGKILL
"""


def test_a_consumer_killed_mid_message_sees_it_redelivered(dsn, conn, orders):
    message_id = scalar(conn, "SELECT courier.enqueue('orders', '{\"job\": 1}')")
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, dsn], stdout=subprocess.PIPE, text=True)
    try:
        held_id, held_lease = map(int, consumer.stdout.readline().split())  # type: ignore[union-attr]
        assert held_id == message_id
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(timeout=10)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    assert conn.execute("SELECT * FROM courier.dequeue('orders')").fetchall() == []  # still leased
    deadline = time.monotonic() + 10
    while not (again := conn.execute("SELECT id, lease, retry_count FROM courier.dequeue('orders')").fetchall()):
        assert time.monotonic() < deadline, "the message never came back"
        time.sleep(0.2)
    assert [(i, r) for i, _, r in again] == [(message_id, 1)] and again[0][1] not in (0, held_lease)
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (message_id, held_lease)) == "lease_lost"


def test_the_application_role_consumes_and_the_monitor_only_looks(conn, orders, login_as):  # noqa: F811
    app = login_as("courier_application")
    message_id = scalar(app, "SELECT courier.enqueue('orders', '{}', p_metadata => '{\"a\": 1}')")
    [(held_id, lease)] = app.execute("SELECT id, lease FROM courier.dequeue('orders', 5)").fetchall()
    assert app.execute("SELECT * FROM courier.extend_lease(ARRAY[%s]::bigint[], ARRAY[%s], 60)",
                       (held_id, lease)).fetchone()[1] == "extended"
    assert scalar(app, "SELECT courier.nack(%s, %s)", (held_id, lease)) == "nacked"
    [(_, lease)] = app.execute("SELECT id, lease FROM courier.dequeue('orders')").fetchall()
    assert scalar(app, "SELECT courier.ack(%s, %s)", (message_id, lease)) == "acked"
    scalar(app, "SELECT courier.enqueue('orders', '{}')")
    assert scalar(app, "SELECT courier.peek('orders')") == 1
    assert len(app.execute("SELECT * FROM courier.receive('orders', 5)").fetchall()) == 1
    for forbidden in ("SELECT courier.requeue(1)", "SELECT courier.run_delete_reaper()",
                      "SELECT * FROM courier.queue"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute(forbidden)

    monitor = login_as("courier_monitor")
    assert scalar(monitor, "SELECT courier.peek('orders')") == 0
    assert scalar(monitor, "SELECT count(*) FROM courier.topics()") == 1
    assert scalar(monitor, "SELECT count(visible_at) FROM courier.queue") == 0  # acked and received: gone
    for forbidden in ("SELECT * FROM courier.dequeue('orders')", "SELECT courier.enqueue('orders', '{}')",
                      "SELECT * FROM courier.receive('orders')", "SELECT payload FROM courier.queue"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            monitor.execute(forbidden)


def test_the_cli_cycle_as_the_issue_shows_it(courier, conn, tmp_path):  # noqa: F811
    assert_ok(courier("topic", "create", "orders", "--max-retries", "5", "--ttl", "3600", "--max-depth", "100000",
                      "--throughput-limit", "500"))
    first = assert_ok(courier("enqueue", "orders", '{"id": 42}', "--key", "order-42", "--json")).json()["id"]
    again = assert_ok(courier("enqueue", "orders", '{"id": 43}', "--key", "order-42", "--json")).json()["id"]
    assert again == first
    pdf = tmp_path / "invoice.pdf"
    pdf.write_bytes(b"%PDF-1.4\x00\xff\xfe")
    assert_ok(courier("enqueue", "orders", "--binary", "--file", str(pdf)))
    held = assert_ok(courier("dequeue", "orders", "--count", "10", "--visibility-timeout", "60", "--json")).json()
    assert [m["payload"] for m in held] == [{"id": 43}, None]
    assert held[1]["payload_binary"] == "JVBERi0xLjQA//4="  # base64 of the file
    assert "acked" in assert_ok(courier("ack", str(held[0]["id"]), str(held[0]["lease"]))).out
    assert "nacked" in assert_ok(courier("nack", str(held[1]["id"]), str(held[1]["lease"]),
                                         "--error", "upstream 500")).out
    late = courier("ack", str(held[0]["id"]), str(held[0]["lease"]), "--json")
    assert late.code == 1 and late.json()["result"] == "not_found"
    # The nacked message waits in the queue again: a settle says it is not leased, not "not found".
    pending = courier("nack", str(held[1]["id"]), str(held[1]["lease"]))
    assert pending.code == 1 and "not leased (it is pending" in pending.out
    # So is one never dequeued, whatever lease is guessed, and no stale report is counted for it.
    fresh = assert_ok(courier("enqueue", "orders", '{"id": 44}', "--json")).json()["id"]
    for verb in (["ack"], ["nack"], ["snooze", "30"]):
        guessed = courier(verb[0], str(fresh), "1", *verb[1:], "--json")
        assert guessed.code == 1 and guessed.json()["result"] == "not_found", verb
    assert "not leased (it is pending" in courier("nack", str(fresh), "7").out
    stale = conn.execute("SELECT count(*) FROM courier.event_log WHERE event_type = 'report.stale_lease' "
                         "AND details -> 'message_ids' @> to_jsonb(ARRAY[%s::bigint])", (fresh,)).fetchone()[0]
    assert stale == 0
    assert_ok(courier("message", "delete", str(fresh)))
    listed = assert_ok(courier("topic", "list", "--json")).json()
    assert listed[0]["topic"] == "orders" and listed[0]["pending"] == 1 and listed[0]["max_depth"] == 100000
    assert assert_ok(courier("peek", "orders", "--json")).json()["estimate"] == 1
    received = assert_ok(courier("receive", "orders", "--count", "10", "--json")).json()
    assert [m["id"] for m in received] == [held[1]["id"]]
    assert assert_ok(courier("reaper", "run", "expiry", "--json")).json() == {"reaper": "expiry", "count": 0}
    assert assert_ok(courier("reaper", "run", "delete", "--json")).json() == {"reaper": "delete", "count": 0}


def test_the_cli_requeues_from_topic_dlq(courier, conn, orders):  # noqa: F811
    message_id = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    for _ in range(2):
        lease = scalar(conn, "SELECT lease FROM courier.dequeue('orders')")
        conn.execute("SELECT courier.nack(%s, %s)", (message_id, lease))
    dlq_id = scalar(conn, "SELECT id FROM courier.dlq")
    wrong = courier("topic", "requeue", "other.dlq", str(dlq_id))
    assert wrong.code == 2 and "belongs to orders.dlq" in wrong.err
    done = assert_ok(courier("topic", "requeue", "orders.dlq", str(dlq_id), "--json")).json()
    assert done["topic"] == "orders" and scalar(conn, "SELECT status FROM courier.queue WHERE id = %s",
                                                (done["id"],)) == "pending"


@pytest.mark.parametrize(("args", "fragments"), [
    (("enqueue", "orders.dlq", "{}"), ("reserved",)),
    (("dequeue", "nosuch"), ("does not exist", "P0002")),
    (("enqueue", "orders", "{}", "--key", "x" * 300), ("key must be 1 to 255",)),
])
def test_cli_errors_are_one_line(courier, orders, args, fragments):  # noqa: F811
    assert_one_line_error(courier(*args), *fragments)


def test_cli_max_depth_refusal_is_one_line(courier, conn):  # noqa: F811
    conn.execute("""SELECT courier.create_endpoint('tiny', 'pull', '{"max_depth": 1}')""")
    assert_ok(courier("enqueue", "tiny", "{}"))
    line = assert_one_line_error(courier("enqueue", "tiny", "{}"), "is full", "53401")
    refused = json.loads(courier("enqueue", "tiny", "{}", "--json").out)
    assert (refused["sqlstate"], refused["kind"]) == ("53401", "Backpressure")
    assert line


def test_topic_alter_changes_some_limits_and_resets_others(courier, conn, orders):  # noqa: F811
    """queue-ti's topic config from the command line: a limit given is set, the rest stay, and
    --reset reverts one (or all) to the global setting."""
    assert_ok(courier("topic", "alter", "orders", "--max-depth", "1000", "--ttl", "3600", "--dlq-threshold", "2"))
    config = assert_ok(courier("topic", "alter", "orders", "--reset", "ttl", "--throughput-limit", "50",
                               "--json")).json()["config"]
    assert config == {"max_retries": 1, "max_depth": 1000, "dlq_threshold": 2, "throughput_limit": 50}
    (listed,) = assert_ok(courier("topic", "list", "--json")).json()
    assert (listed["max_depth"], listed["message_ttl_seconds"], listed["dlq_threshold"]) == (1000, 0, 2)
    assert "every limit follows its global setting" in assert_ok(courier("topic", "alter", "orders", "--reset",
                                                                         "all")).out
    assert scalar(conn, "SELECT config FROM courier.endpoints WHERE name = 'orders'") == {}
    for args in (("topic", "alter", "orders"), ("topic", "alter", "orders", "--max-depth", "5", "--reset", "max-depth"),
                 ("topic", "alter", "orders", "--dlq-threshold", "1001")):
        refused = courier(*args)
        assert refused.code == 2 and "Traceback" not in refused.err, (args, refused)
    assert_one_line_error(courier("topic", "alter", "nowhere", "--max-depth", "5"), "does not exist")


def test_cli_bad_arguments_are_usage_errors(courier, orders):  # noqa: F811
    for args in (("dequeue", "orders", "--count", "0"), ("enqueue", "orders", "{bad"), ("ack", "x", "1"),
                 ("reaper", "run", "sometimes"), ("topic", "create", "t", "--max-retries", "-1")):
        result = courier(*args)
        assert result.code == 2 and "Traceback" not in result.err, (args, result)


def test_unreachable_database_is_one_line(orders):
    from tests.test_cli import run

    result = run("dequeue", "orders", dsn="postgresql://nobody@127.0.0.1:1/none")
    assert_one_line_error(result, "cannot connect")



def test_the_console_shows_a_topics_leases(dsn, conn, orders):
    from console.app.panes.messages import message_detail
    from console.app.widgets.live_table import LiveTable
    from sqlkit import messages
    from tests.console_driver import open_pane, run_console, wait_for

    first = scalar(conn, "SELECT courier.enqueue('orders', '{\"n\": 1}', 'order-1')")
    conn.execute("SELECT courier.enqueue('orders', '{\"n\": 2}')")
    [(_, lease, until)] = conn.execute("SELECT id, lease, visible_until FROM courier.dequeue('orders', 1, 600)")

    def cells(app) -> list[str]:
        table = app.pane.query_one(LiveTable)
        return [str(getattr(c, "plain", c)) for c in table.get_row("orders")] if table.row_count else []

    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        row = await wait_for(pilot, lambda: cells(app), what="the topic's row")
        # The column that explains the row's state sits beside it (issue 41): for a topic, its leases.
        assert row[1] == "topic" and row[2].startswith("1 leased, next lease ends ")
        assert row[3:6] == ["0", "1", "1"] and row[-1] == "pull"
    run_console(dsn, scenario)

    detail = dict(message_detail(messages.get(conn, first), None).fields)
    assert (detail["key"], detail["lease"]) == ("order-1", lease)
    assert detail["visible until"] == until.astimezone(None).strftime("%Y-%m-%d %H:%M:%S")


@pytest.mark.parametrize("setting, value", [("delete_reaper_interval", "3600"),
                                            ("delete_reaper_schedule", "@daily")])
def test_a_workers_maintenance_leader_runs_both_reapers(dsn, conn, orders, setting, value):
    from tests.test_maintenance import stop
    from tests.workers import start_worker_process
    from tests.workers import wait_for as wait_until

    held = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    conn.execute("SELECT * FROM courier.dequeue('orders', 1, 3600)")
    kept = scalar(conn, "SELECT courier.enqueue('orders', '{}')")
    conn.execute("UPDATE courier.queue SET expires_at = now() - interval '1 second' WHERE id = %s", (held,))
    conn.execute("SELECT courier.set_setting(%s, %s)", (setting, value))
    # A schedule set two days ago has named a time since (an interval is due at once).
    conn.execute("UPDATE courier.settings SET updated_at = now() - interval '2 days' WHERE name = %s", (setting,))
    worker = start_worker_process(dsn)
    try:
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM courier.reaper_runs") == 2, timeout=30)
    finally:
        assert stop(worker) == 0
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (held,)) == 0  # expired, then deleted
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE id = %s", (held,)) == 0
    assert scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (kept,)) == "pending"  # no worker took it
