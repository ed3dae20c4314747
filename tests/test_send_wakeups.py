"""Sends wake the workers at commit, with one NOTIFY per endpoint among the producers committing
together, and the worker's linger picks up the messages of those that skipped theirs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from console.workers.awake import WakeHold
from console.workers.pool import PoolSettings, WorkerPool
from console.workers.settings import PoolStats
from sqlkit.connection import AsyncDatabase
from tests import test_roles_and_psql
from tests.helpers import scalar
from tests.workers import wait_for

login_as = test_roles_and_psql.login_as  # the fixture: logs in as a new member of a role

FALLBACK_POLL = 60.0
"""The pool's poll interval in these tests: a message that waited for it would fail them."""

PROMPTLY = 10.0
"""Seconds a message may take to be delivered: generous, and far below FALLBACK_POLL."""


@pytest.fixture
def noop(conn) -> int:
    return scalar(conn, "SELECT courier.create_endpoint('sink', 'noop', '{}')")


@pytest.fixture
def listener(dsn):
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("LISTEN courier_new_msg")
        yield connection


def payloads(listener: psycopg.Connection, timeout: float = 0.5) -> list[str]:
    return [note.payload for note in listener.notifies(timeout=timeout)]


class RunningPool:
    """A worker pool in a thread of its own that polls only every FALLBACK_POLL seconds."""

    def __init__(self, dsn: str) -> None:
        self.pool = WorkerPool(dsn, PoolSettings(poll_interval=FALLBACK_POLL, report_interval=0.005))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.pool.run()), daemon=True)

    def __enter__(self) -> WorkerPool:
        self.thread.start()
        return self.pool

    def __exit__(self, *exc: object) -> None:
        self.pool.stop_threadsafe()
        self.thread.join(timeout=30)


def delivered(pool: WorkerPool, count: int) -> None:
    wait_for(lambda: pool.stats.delivered >= count, timeout=PROMPTLY, interval=0.01)


def test_messages_of_many_producers_committing_at_once_are_delivered_without_the_fallback_poll(dsn, conn, noop):
    producers, rounds = 8, 12
    connections = [psycopg.connect(dsn, autocommit=True) for _ in range(producers)]
    try:
        with RunningPool(dsn) as pool:
            conn.execute("SELECT courier.send('sink', '{}')")
            delivered(pool, 1)  # the worker listens now
            for sent in range(1 + producers, 1 + producers * rounds + 1, producers):
                start = threading.Barrier(producers)

                def produce(connection: psycopg.Connection, start: threading.Barrier = start) -> None:
                    start.wait()
                    connection.execute("SELECT courier.send('sink', '{}')")

                threads = [threading.Thread(target=produce, args=(c,)) for c in connections]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                delivered(pool, sent)
    finally:
        for connection in connections:
            connection.close()
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status IN ('pending', 'processing')") == 0


def two_slow_producers(dsn: str, conn: psycopg.Connection, endpoint: str) -> Callable[[], None]:
    """A function that runs two producers, each sending {"n": 1} or {"n": 2} to `endpoint` and
    then spending 0.3 s in commit-time work of the application's own (a deferred trigger), as a
    slow disk or a synchronous standby would. The second starts committing while the first is
    still at it, so the first NOTIFYs, the second skips its NOTIFY, and the second's message
    becomes visible only after the wake-up the first sent was answered."""
    conn.execute("CREATE TABLE public.outbox_audit (n int)")
    conn.execute("CREATE FUNCTION public.slow_audit() RETURNS trigger LANGUAGE plpgsql AS "
                 "'BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END'")
    conn.execute("CREATE CONSTRAINT TRIGGER slow_audit AFTER INSERT ON public.outbox_audit "
                 "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.slow_audit()")

    def produce(n: int) -> None:
        with psycopg.connect(dsn) as producer:
            producer.execute("SELECT courier.send(%s, %s::jsonb)", (endpoint, f'{{"n": {n}}}'))
            producer.execute("INSERT INTO public.outbox_audit VALUES (%s)", (n,))
            producer.commit()

    def run() -> None:
        first = threading.Thread(target=produce, args=(1,))
        second = threading.Thread(target=produce, args=(2,))
        first.start()
        time.sleep(0.1)
        second.start()
        first.join()
        second.join()

    return run


def test_a_producer_whose_commit_ends_after_another_producers_wakeup_is_delivered_without_the_poll(
        dsn, conn, noop):
    produce = two_slow_producers(dsn, conn, "sink")
    with RunningPool(dsn) as pool:
        conn.execute("SELECT courier.send('sink', '{}')")
        delivered(pool, 1)
        produce()
        delivered(pool, 3)


def test_a_producer_transaction_held_open_wakes_the_worker_when_it_commits(dsn, conn, noop):
    with RunningPool(dsn) as pool, psycopg.connect(dsn) as outbox:
        conn.execute("SELECT courier.send('sink', '{}')")
        delivered(pool, 1)
        outbox.execute("SELECT courier.send('sink', '{\"outbox\": true}')")  # its transaction stays open
        for _ in range(5):  # others send, commit and wake the worker meanwhile
            conn.execute("SELECT courier.send('sink', '{}')")
        delivered(pool, 6)
        time.sleep(0.2)
        outbox.commit()
        delivered(pool, 7)


def test_the_wakeup_is_sent_at_commit_once_per_endpoint(dsn, noop, listener):
    other = 0
    with psycopg.connect(dsn) as producer:
        other = scalar(producer, "SELECT courier.create_endpoint('other', 'noop', '{}')")
        producer.commit()
        payloads(listener)
        producer.execute("SELECT courier.send('sink', '{}')")
        producer.execute("SELECT courier.send_batch('sink', ARRAY['{}', '{}']::jsonb[])")
        producer.execute("SELECT courier.send('other', '{}')")
        assert payloads(listener) == []
        producer.commit()
    assert sorted(payloads(listener)) == sorted([str(noop), str(other)])


def test_scheduled_messages_do_not_notify(conn, noop, listener):
    conn.execute("SELECT courier.send_with_options('sink', '{}', p_scheduled_at := now() + interval '1 hour')")
    conn.execute("SELECT courier.send_batch_with_options('sink', ARRAY['{}', '{}']::jsonb[], "
                 "p_scheduled_at := ARRAY[now() + interval '1 hour', now() + interval '2 hours'])")
    assert payloads(listener) == []
    conn.execute("SELECT courier.send_batch_with_options('sink', ARRAY['{}', '{}']::jsonb[], "
                 "p_scheduled_at := ARRAY[now() + interval '1 hour', NULL])")
    assert payloads(listener) == [str(noop)]


def test_a_due_send_wakes_even_when_a_scheduled_one_follows_it_in_the_transaction(dsn, noop, listener):
    """The wake-up is asked for by the counter write of the due send; the scheduled send after it
    sets the request off for its own write, and takes nothing back."""
    with psycopg.connect(dsn) as producer:
        producer.execute("SELECT courier.send('sink', '{}')")
        producer.execute("SELECT courier.send_with_options('sink', '{}', p_scheduled_at := now() + interval '1 hour')")
    assert payloads(listener) == [str(noop)]


def test_consumers_writing_the_counters_wake_no_one(dsn, conn, listener):
    """Dequeue, nack, ack and receive move messages between counters, in transactions of their
    own: none of their writes queues a wake-up."""
    topic = scalar(conn, "SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    conn.execute("SELECT courier.send_batch('jobs', ARRAY['{}', '{}', '{}', '{}']::jsonb[])")
    assert payloads(listener) == [str(topic)]
    taken = conn.execute("SELECT id, lease FROM courier.dequeue('jobs', 2, 60)").fetchall()
    conn.execute("SELECT courier.nack(%s, %s)", taken[0])
    conn.execute("SELECT courier.ack(%s, %s)", taken[1])
    conn.execute("SELECT count(*) FROM courier.receive('jobs', 2)")
    assert payloads(listener) == []


def test_a_send_rolled_back_to_a_savepoint_does_not_notify(dsn, noop, listener):
    with psycopg.connect(dsn) as producer, producer.transaction():
        with pytest.raises(psycopg.errors.RaiseException), producer.transaction():
            producer.execute("SELECT courier.send('sink', '{}')")
            producer.execute("DO $$ BEGIN RAISE EXCEPTION 'changed my mind'; END $$")
        producer.execute("SELECT courier.send_with_options('sink', '{}', "
                         "p_scheduled_at := now() + interval '1 hour')")
    assert payloads(listener) == []


def test_notify_on_send_off_silences_single_sends_but_not_batches(conn, noop, listener):
    conn.execute("SELECT courier.set_setting('notify_on_send', 'false')")
    conn.execute("SELECT courier.send('sink', '{}')")
    assert payloads(listener) == []
    conn.execute("SELECT courier.send_batch('sink', ARRAY['{}']::jsonb[])")
    assert payloads(listener) == [str(noop)]


@pytest.mark.parametrize("protocol, produce", [("noop", "send"), ("pull", "enqueue")])
def test_a_send_committing_while_another_producer_notifies_leaves_the_notify_to_it(dsn, conn, listener, protocol,
                                                                                   produce):
    endpoint = scalar(conn, "SELECT courier.create_endpoint('sink', %s, '{}')", (protocol,))
    # What a producer in the middle of its commit holds after taking the endpoint's wake lock.
    with psycopg.connect(dsn, autocommit=True) as notifier:
        notifier.execute("SELECT pg_advisory_lock(hashtext('courier.wake_workers'), %s)", (endpoint,))
        conn.execute(f"SELECT courier.{produce}('sink', '{{}}')")
        assert payloads(listener) == []
        notifier.execute("SELECT pg_advisory_unlock(hashtext('courier.wake_workers'), %s)", (endpoint,))
    conn.execute(f"SELECT courier.{produce}('sink', '{{}}')")
    assert payloads(listener) == [str(endpoint)]


def test_the_application_role_gets_its_wakeup_at_commit(dsn, conn, noop, listener, login_as):
    app = login_as("courier_application")
    with app.transaction():
        app.execute("SELECT courier.send('sink', '{}')")
        app.execute("SELECT courier.send('sink', '{}')")
    assert payloads(listener) == [str(noop)]


def test_while_a_claim_loop_holds_the_wake_lock_commits_send_no_notify(dsn, noop, listener):
    """The awake loop's hold (console/workers/awake.py): producers' commits skip their NOTIFY
    while it is held, as they do while another producer holds it, and wake again once it is not."""
    async def scenario() -> tuple[list[str], list[str], list[str]]:
        db = AsyncDatabase(dsn)
        hold = WakeHold(db, PoolStats())
        with psycopg.connect(dsn, autocommit=True) as producer:
            await hold.hold(noop)
            assert hold.holds(noop)
            producer.execute("SELECT courier.send('sink', '{}')")
            held = payloads(listener)
            assert await hold.release(noop)
            producer.execute("SELECT courier.send('sink', '{}')")
            released = payloads(listener)
            await hold.hold(noop)
            await hold.close()  # its session's end lets go too
            producer.execute("SELECT courier.send('sink', '{}')")
            closed = payloads(listener)
        return held, released, closed

    held, released, closed = asyncio.run(scenario())
    assert (held, released, closed) == ([], [str(noop)], [str(noop)])


def test_producers_sending_back_to_back_are_delivered_without_the_poll_and_notify_seldom(
        dsn, conn, noop, listener):
    producers, sends = 4, 250

    def produce() -> None:
        with psycopg.connect(dsn, autocommit=True) as producer:
            for _ in range(sends):
                producer.execute("SELECT courier.send('sink', '{}')")

    with RunningPool(dsn) as pool:
        threads = [threading.Thread(target=produce) for _ in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        delivered(pool, producers * sends)
        woken = len(payloads(listener))
        # About two in five before the awake loop held the wake lock, one in twenty with it.
        assert woken < producers * sends / 5, woken
        time.sleep(0.5)  # the loop found nothing, let go of the lock and waits: a send wakes it
        conn.execute("SELECT courier.send('sink', '{}')")
        delivered(pool, producers * sends + 1)


def test_a_wake_lock_lost_with_its_connection_still_sends_its_loop_to_look_once_more(dsn, conn, noop):
    """The server drops a session's advisory locks with it; producers that skipped their NOTIFY
    before that are found only by the look that follows a release, so the loop must still make it."""
    other = scalar(conn, "SELECT courier.create_endpoint('other', 'noop', '{}')")

    async def scenario() -> tuple[bool, bool, bool]:
        hold = WakeHold(AsyncDatabase(dsn), PoolStats())
        await hold.hold(noop)
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_locks "
                     "WHERE locktype = 'advisory' AND objid = %s AND granted", (noop,))
        await hold.hold(other)  # fails on the dead connection, which is closed
        return hold.holds(noop), await hold.release(noop), await hold.release(noop)

    assert asyncio.run(scenario()) == (False, True, False)
