"""The long poll in SQL (pgmq's read_with_poll, issue 42 item 10): CALL courier.dequeue_wait waits
up to wait_seconds for a message, for clients that speak only SQL, committing between its tries
so that no snapshot holds back the xmin horizon while it waits. Against a real database, with
producers on connections of their own."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from sqlkit import pull
from sqlkit.exact_json import JsonNumber
from tests import test_roles_and_psql
from tests.helpers import scalar

login_as = test_roles_and_psql.login_as  # the fixture: logs in as a new member of a role

SLEEP_CAP = 0.25
"""The longest sleep between two tries (sqlkit/functions/pull.sql)."""


@pytest.fixture
def orders(conn) -> str:
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    return "orders"


def dequeue_wait(conn: psycopg.Connection, wait: int | None, count: int = 1, topic: str = "orders",
                 timeout: int | None = None) -> list[dict[str, Any]]:
    return scalar(conn, "CALL courier.dequeue_wait(%s, %s, %s, %s)", (topic, count, timeout, wait))


def enqueue(conn: psycopg.Connection, payload: Any, topic: str = "orders", **options: Any) -> int:
    names = "".join(f", p_{name} => %({name})s" for name in options)
    return scalar(conn, f"SELECT courier.enqueue(%(topic)s, %(payload)s{names})",
                  {"topic": topic, "payload": Jsonb(payload), **options})


def status(conn: psycopg.Connection, message_id: int) -> str | None:
    return scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (message_id,))


class Waiter(threading.Thread):
    """A dequeue_wait on a connection of its own, timed from the moment it starts."""

    def __init__(self, dsn: str, wait: int, **options: Any) -> None:
        super().__init__(daemon=True)
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.wait, self.options = wait, options
        self.result: list[dict[str, Any]] | None = None
        self.error: BaseException | None = None
        self.started_at = self.returned_at = 0.0

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            self.result = dequeue_wait(self.conn, self.wait, **self.options)
        except BaseException as error:  # handed to the test
            self.error = error
        finally:
            self.returned_at = time.monotonic()
            self.conn.close()

    def answer(self) -> list[dict[str, Any]]:
        self.join(30)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


# Answers -------------------------------------------------------------------------------------


def test_a_message_already_there_is_taken_at_once_under_a_lease(conn, orders):
    message_id = enqueue(conn, {"n": 1.10}, payload_binary=b"\x00\x01", key="k-1",
                         metadata=Jsonb({"region": "eu"}))
    started = time.monotonic()
    [message] = dequeue_wait(conn, 5, count=10, timeout=60)
    assert time.monotonic() - started < 1
    # dequeue()'s columns, with payload_binary in base64
    assert set(message) == {"id", "lease", "payload", "payload_binary", "body", "metadata", "key", "retry_count",
                            "max_retries", "created_at", "visible_until"}
    assert (message["id"], message["payload"], message["payload_binary"], message["key"], message["metadata"]) \
        == (message_id, {"n": 1.10}, "AAE=", "k-1", {"region": "eu"})
    assert status(conn, message_id) == "processing"
    assert scalar(conn, "SELECT visible_at > now() + interval '55 seconds' FROM courier.queue WHERE id = %s",
                  (message_id,))
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (message_id, message["lease"])) == "acked"


def test_it_returns_as_soon_as_another_connection_enqueues(dsn, conn, orders):
    waiter = Waiter(dsn, 10)
    waiter.start()
    time.sleep(1.2)  # long enough for its sleeps to reach their cap
    assert waiter.is_alive()
    message_id = enqueue(conn, {"n": 1})
    committed = time.monotonic()
    [message] = waiter.answer()
    assert message["id"] == message_id
    latency = waiter.returned_at - committed
    assert latency < SLEEP_CAP + 0.35, latency  # within one sleep of the commit, not the 10 s wait
    assert status(conn, message_id) == "processing"


def test_it_returns_nothing_after_the_wait_when_nothing_comes(conn, orders):
    started = time.monotonic()
    assert dequeue_wait(conn, 1) == []
    assert 1.0 <= time.monotonic() - started < 1.0 + SLEEP_CAP + 0.4


def test_a_message_scheduled_to_come_due_during_the_wait_is_taken_when_due(conn, orders):
    """Every try is a transaction with a now() of its own: a function's would stand still, and a
    message coming due (or a lease lapsing) during its wait would go unseen."""
    message_id = enqueue(conn, {"n": 1}, scheduled_at=scalar(conn, "SELECT now() + interval '1 second'"))
    started = time.monotonic()
    [message] = dequeue_wait(conn, 5)
    assert message["id"] == message_id
    assert 0.8 <= time.monotonic() - started < 1.0 + SLEEP_CAP + 0.4


def test_of_two_waiters_one_takes_the_message_and_the_other_waits_on(dsn, conn, orders):
    first, second = Waiter(dsn, 2), Waiter(dsn, 2)
    first.start()
    second.start()
    time.sleep(0.3)
    message_id = enqueue(conn, {"n": 1})
    answers = [first.answer(), second.answer()]
    assert sorted(len(answer) for answer in answers) == [0, 1]
    assert [m["id"] for answer in answers for m in answer] == [message_id]
    empty = first if answers[0] == [] else second
    assert empty.returned_at - empty.started_at >= 2.0


def test_it_polls_with_a_bounded_backoff_not_a_busy_loop(conn, orders):
    """Tries 10 ms apart, doubling to 250 ms: a dozen or so in two seconds."""
    conn.execute("SET track_functions = 'all'")
    assert dequeue_wait(conn, 2) == []
    conn.execute("SELECT pg_stat_force_next_flush()")  # flushed as the session goes idle
    conn.execute("SELECT 1")
    tries = scalar(conn, "SELECT calls FROM pg_stat_user_functions WHERE schemaname = 'courier' "
                         "AND funcname = 'dequeue'")
    assert 6 <= tries <= 20, tries


# Holding no horizon ----------------------------------------------------------------------------


def test_while_it_waits_its_snapshots_are_fresh_ones(dsn, conn, orders):
    """The waiting session's backend_xmin is NULL or as new as a snapshot taken one sleep (250 ms)
    before: it lets go of every transaction that ends while it waits. A statement that waits
    (pgmq's read_with_poll, a function's loop) keeps the xmin it began with. Compared with fresh
    snapshots, not a fixed xid: a snapshot's xmin is the oldest transaction running anywhere in
    the cluster, which other databases' sessions may hold back."""
    waiter = Waiter(dsn, 4)
    with psycopg.connect(dsn) as blocker, psycopg.connect(dsn, autocommit=True) as statement:
        running = scalar(blocker, "SELECT pg_current_xact_id()::xid::text::bigint")  # as the waits begin
        statement_pid = statement.info.backend_pid
        pgmq_like = threading.Thread(target=statement.execute, args=("SELECT pg_sleep(3)",), daemon=True)
        waiter.start()
        pgmq_like.start()
        time.sleep(0.3)
        blocker.commit()
        samples: list[tuple[float, int, dict[int, tuple[str, int | None]]]] = []
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            rows = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::xid::text::bigint, pid, state, "
                                "backend_xmin::text::bigint FROM pg_stat_activity WHERE pid = ANY (%s)",
                                ([waiter.pid, statement_pid],)).fetchall()
            samples.append((time.monotonic(), rows[0][0], {pid: (state, xmin) for _, pid, state, xmin in rows}))
            time.sleep(0.01)
        pgmq_like.join(10)
    assert waiter.answer() == []
    checked = 0
    for at, _, sessions in samples:
        state, xmin = sessions[waiter.pid]
        assert state == "active"  # seen mid-wait, throughout
        earlier = [fresh for then, fresh, _ in samples if then <= at - SLEEP_CAP - 0.1]
        if earlier and xmin is not None:
            assert xmin >= earlier[-1], (xmin, earlier[-1])
            checked += 1
    assert checked > 50
    held = [sessions[statement_pid][1] for _, _, sessions in samples if statement_pid in sessions]
    assert held and all(xmin is not None and xmin <= running for xmin in held)
    if samples[-1][1] > running:  # the cluster moved on past the blocker: the waiter did, the statement not
        assert all(sessions[waiter.pid][1] is None or sessions[waiter.pid][1] > running
                   for at, _, sessions in samples if at > samples[-1][0] - 1.0)


def test_vacuum_removes_rows_deleted_while_it_waits(dsn, conn, orders):
    """Rows deleted after the wait began are removed by a VACUUM while it still waits. Tried a few
    times: an autovacuum's ANALYZE, or a transaction in another database (whose xid every fresh
    snapshot's xmin counts), holds the horizon for a moment; a waiter that held a snapshot from
    before the delete (a function's wait) would fail every try."""
    conn.execute("CREATE TABLE scratch WITH (autovacuum_enabled = false) AS "
                 "SELECT n FROM generate_series(1, 5000) AS n")
    conn.execute("VACUUM scratch")
    assert scalar(conn, "SELECT pg_relation_size('scratch')") > 0
    waiter = Waiter(dsn, 6)
    waiter.start()
    time.sleep(0.5)
    deleted_by = scalar(conn, "WITH d AS (DELETE FROM scratch RETURNING 1) "
                              "SELECT pg_current_xact_id()::xid::text::bigint FROM d LIMIT 1")
    time.sleep(SLEEP_CAP + 0.25)
    held_elsewhere = False
    for _ in range(8):
        assert waiter.is_alive()
        conn.execute("VACUUM scratch")
        if scalar(conn, "SELECT pg_relation_size('scratch')") == 0:  # every row removed, the file truncated
            break
        held_elsewhere |= scalar(conn, "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid <> %s "
                                       "AND age(backend_xid) > age(%s::text::xid)", (waiter.pid, str(deleted_by)))
        time.sleep(0.3)
    else:
        if held_elsewhere:
            pytest.skip("a transaction older than the delete ran elsewhere in the cluster throughout")
        pytest.fail("VACUUM kept the rows deleted while dequeue_wait waited")
    assert waiter.answer() == []
    # The control: a snapshot held across the delete keeps the rows.
    conn.execute("INSERT INTO scratch SELECT n FROM generate_series(1, 5000) AS n")
    with psycopg.connect(dsn) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM scratch")
        conn.execute("DELETE FROM scratch")
        conn.execute("VACUUM scratch")
        assert scalar(conn, "SELECT pg_relation_size('scratch')") > 0
        holder.rollback()


# Bounds and transaction blocks -----------------------------------------------------------------


@pytest.mark.parametrize("wait", [-1, 21, None])
def test_wait_seconds_is_bounded_to_0_through_20(conn, orders, wait):
    message_id = enqueue(conn, {"n": 1})
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        dequeue_wait(conn, wait)
    assert refused.value.diag.message_primary \
        == f"[courier] wait_seconds must be between 0 and 20, got {'NULL' if wait is None else wait}"
    assert status(conn, message_id) == "pending"  # refused before any dequeue


def test_the_bounds_themselves_are_accepted(conn, orders):
    enqueue(conn, {"n": 1})
    assert len(dequeue_wait(conn, 20)) == 1  # returns at once: a message is there
    started = time.monotonic()
    assert dequeue_wait(conn, 0) == []  # one try
    assert time.monotonic() - started < 0.5


def test_in_a_transaction_block_a_wait_is_refused_before_any_dequeue(dsn, conn, orders):
    message_id = enqueue(conn, {"n": 1})
    with psycopg.connect(dsn) as in_block:  # not autocommit: the driver sends BEGIN first
        with pytest.raises(psycopg.errors.InvalidTransactionTermination) as refused:
            dequeue_wait(in_block, 1)
        assert refused.value.diag.message_primary == "[courier] dequeue_wait cannot wait inside a transaction block"
        assert "autocommit" in refused.value.diag.message_hint
        in_block.rollback()
        assert status(conn, message_id) == "pending"
        # wait_seconds 0 is one try, a dequeue(), and works in a block: its lease is the block's
        [message] = dequeue_wait(in_block, 0)
        assert message["id"] == message_id
        in_block.rollback()
    assert status(conn, message_id) == "pending"


def test_from_a_function_a_wait_is_refused_and_from_a_do_block_it_waits(conn, orders):
    conn.execute("CREATE FUNCTION pg_temp.poll() RETURNS jsonb LANGUAGE plpgsql AS $$ "
                 "DECLARE v jsonb; BEGIN CALL courier.dequeue_wait('orders', 1, NULL, 1, v); RETURN v; END $$")
    with pytest.raises(psycopg.errors.InvalidTransactionTermination, match="inside a transaction block"):
        conn.execute("SELECT pg_temp.poll()")
    started = time.monotonic()
    conn.execute("DO $$ DECLARE v jsonb; BEGIN CALL courier.dequeue_wait('orders', 1, NULL, 1, v); END $$")
    assert time.monotonic() - started >= 1.0  # a DO of its own may commit: it waited


# Rights and the Python wrapper -----------------------------------------------------------------


def test_the_application_may_call_it_and_the_monitor_may_not(conn, orders, login_as):
    message_id = enqueue(conn, {"n": 1})
    app = login_as("courier_application")
    [message] = dequeue_wait(app, 1)
    assert message["id"] == message_id
    assert scalar(app, "SELECT courier.ack(%s, %s)", (message_id, message["lease"])) == "acked"
    monitor = login_as("courier_monitor")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        dequeue_wait(monitor, 0)
    assert not scalar(conn, "SELECT has_function_privilege('public', "
                            "'courier.dequeue_wait(text, integer, integer, integer, jsonb)', 'EXECUTE')")


def test_the_python_wrapper_answers_as_dequeue_does(dsn, conn, orders):
    big = JsonNumber("12345678901234567.89")
    message_id = pull.enqueue(conn, "orders", {"big": big}, payload_binary=b"\x00\xff", key="k")
    [message] = pull.dequeue_wait(conn, "orders", count=5, visibility_timeout=60, wait_seconds=1)
    assert isinstance(message, pull.LeasedMessage)
    assert (message.id, message.payload, message.payload_binary, message.key) == (message_id, {"big": big},
                                                                                  b"\x00\xff", "k")
    assert message.visible_until > message.created_at and message.created_at.tzinfo is not None
    assert pull.ack(conn, [message.id], [message.lease])[0].result == "acked"
    waiter = threading.Thread(target=lambda: time.sleep(0.5) or pull.enqueue(conn, "orders", {"n": 2}))
    with psycopg.connect(dsn, autocommit=True) as own:
        waiter.start()
        [late] = pull.dequeue_wait(own, "orders", wait_seconds=5)
    waiter.join()
    assert late.payload == {"n": 2} and late.payload_binary is None
