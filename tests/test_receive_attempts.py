"""The receive loop counts every attempt of a failing handler (issue 23, item 6): a handler that
always raises runs exactly max_retries + 1 times, each recorded in the dead letter's history,
and no slot takes a message another slot of the loop has failed on before that failure is
recorded (which also held it back for its back-off)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from sqlkit.consumer import ReceivedMessage, ReceiveLoop
from tests.helpers import scalar

TOPIC = "orders"


@pytest.fixture(autouse=True)
def _quiet_handler_failures(caplog):
    caplog.set_level(logging.CRITICAL, logger="courier.consumer")  # a traceback per failed attempt


def _topic(conn: psycopg.Connection, max_retries: int) -> None:
    conn.execute("SELECT courier.create_endpoint(%s, 'pull', %s::jsonb)",
                 (TOPIC, psycopg.types.json.Jsonb({"max_retries": max_retries})))


def _enqueue(conn: psycopg.Connection, count: int) -> list[int]:
    return [scalar(conn, "SELECT courier.enqueue(%s, %s::jsonb)", (TOPIC, psycopg.types.json.Jsonb({"n": n})))
            for n in range(count)]


def _run_until(loop: ReceiveLoop, done, timeout: float) -> None:
    async def run() -> None:
        task = asyncio.create_task(loop.run())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not task.done() and not await asyncio.to_thread(done):
            await asyncio.sleep(0.05)
        loop.stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())


@pytest.mark.parametrize("max_retries", [0, 3])
def test_a_failing_handler_runs_exactly_max_retries_plus_one_times(dsn, conn, max_retries):
    """Twenty messages whose handler always raises, four slots: before the fix a slot took a
    message between another slot's rollback and its recorded failure, and handlers ran 5 to 8
    times where each dead letter recorded 4 attempts."""
    _topic(conn, max_retries)
    ids = _enqueue(conn, 20)
    runs: Counter[int] = Counter()

    async def handler(message: ReceivedMessage) -> None:
        runs[message.id] += 1
        raise RuntimeError("cannot handle this one")

    loop = ReceiveLoop(dsn, TOPIC, handler, peek_interval=0.1, concurrency=4)
    _run_until(loop, lambda: scalar(conn, "SELECT count(*) FROM courier.dlq") == len(ids), timeout=30)
    recorded = dict(conn.execute("SELECT original_message_id, jsonb_array_length(error_history) FROM courier.dlq"))
    assert recorded == dict.fromkeys(ids, max_retries + 1)
    assert runs == dict.fromkeys(ids, max_retries + 1)
    assert loop.failed == len(ids) * (max_retries + 1)
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_a_failed_message_waits_out_its_back_off_before_any_slot_takes_it_again(dsn, conn):
    """Forty messages failing on their first attempt only, four slots: every message is handled
    twice, and its second attempt comes after the one-second back-off its recorded failure set,
    never straight after the failure from another slot."""
    _topic(conn, 5)
    ids = _enqueue(conn, 40)
    failed_at: dict[int, float] = {}
    retried_after: dict[int, float] = {}
    runs: Counter[int] = Counter()

    async def handler(message: ReceivedMessage) -> None:
        runs[message.id] += 1
        if message.id not in failed_at:
            failed_at[message.id] = time.monotonic()
            raise RuntimeError("first attempt fails")
        retried_after.setdefault(message.id, time.monotonic() - failed_at[message.id])

    loop = ReceiveLoop(dsn, TOPIC, handler, peek_interval=0.1, concurrency=4)
    _run_until(loop, lambda: scalar(conn, "SELECT count(*) FROM courier.queue") == 0, timeout=30)
    assert runs == dict.fromkeys(ids, 2)
    too_soon = {message_id: round(after, 3) for message_id, after in retried_after.items() if after < 0.9}
    assert too_soon == {}
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0


def test_a_failure_is_recorded_after_a_receiver_that_took_the_message_meanwhile(dsn, conn):
    """The protocol any receiving client can follow (what ReceiveLoop does), in SQL. Between one
    receiver's rollback and its recorded failure another took the message: lock_received waits
    for that one, and when it rolls back too, the failure is recorded, held back for its back-off,
    where receive_failed alone skipped the held message and recorded nothing."""
    _topic(conn, 3)
    [message] = _enqueue(conn, 1)
    with psycopg.connect(dsn) as failing, psycopg.connect(dsn) as other:
        assert scalar(failing, "SELECT id FROM courier.receive(%s)", (TOPIC,)) == message
        failing.rollback()  # the handler raised
        assert scalar(other, "SELECT id FROM courier.receive(%s)", (TOPIC,)) == message  # took it meanwhile

        def record() -> str:
            assert scalar(failing, "SELECT courier.lock_received(%s, %s)", (TOPIC, message)) == message
            outcome = scalar(failing, "SELECT courier.receive_failed(%s, %s, 'first')", (TOPIC, message))
            failing.commit()
            return outcome

        with ThreadPoolExecutor(1) as pool:
            recording = pool.submit(record)
            time.sleep(0.3)
            assert not recording.done()  # waiting for the other receiver
            other.rollback()  # its handler raised too
            assert recording.result(timeout=10) == "retry"
        assert scalar(other, "SELECT courier.lock_received(%s, %s)", (TOPIC, message)) == message
        assert scalar(other, "SELECT courier.receive_failed(%s, %s, 'second')", (TOPIC, message)) == "retry"
        other.commit()
    assert conn.execute("SELECT retry_count, error_history -> 0 ->> 'error', error_history -> 1 ->> 'error' "
                        "FROM courier.queue WHERE id = %s", (message,)).fetchone() == (2, "first", "second")
    assert scalar(conn, "SELECT id FROM courier.receive(%s)", (TOPIC,)) is None  # waiting out its back-off


def test_lock_received_finds_nothing_once_another_receiver_committed_it(dsn, conn):
    _topic(conn, 3)
    [message] = _enqueue(conn, 1)
    with psycopg.connect(dsn) as failing, psycopg.connect(dsn) as other:
        assert scalar(other, "SELECT id FROM courier.receive(%s)", (TOPIC,)) == message
        with ThreadPoolExecutor(1) as pool:
            locking = pool.submit(scalar, failing, "SELECT courier.lock_received(%s, %s)", (TOPIC, message))
            time.sleep(0.3)
            other.commit()  # handled there
            assert locking.result(timeout=10) is None
        assert scalar(failing, "SELECT courier.receive_failed(%s, %s, 'late')", (TOPIC, message)) == "not_found"
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    assert scalar(conn, "SELECT courier.lock_received(%s, %s)", (TOPIC, 10 ** 12)) is None


def test_a_message_received_after_its_lease_ran_out_has_its_failures_counted_too(dsn, conn):
    """A dequeuer died holding the message; once its lease ran out a receive takes it (still
    'processing'). Its failures were never recorded (receive_failed wanted 'pending'): the
    handler ran 45 times in 5 s and the message never reached the DLQ."""
    _topic(conn, 1)
    [message] = _enqueue(conn, 1)
    lease = scalar(conn, "SELECT lease FROM courier.dequeue(%s, 1, 1)", (TOPIC,))
    time.sleep(1.2)
    runs: Counter[int] = Counter()

    async def handler(received: ReceivedMessage) -> None:
        runs[received.id] += 1
        raise RuntimeError("cannot handle this one")

    loop = ReceiveLoop(dsn, TOPIC, handler, peek_interval=0.1, concurrency=2)
    _run_until(loop, lambda: scalar(conn, "SELECT count(*) FROM courier.dlq") == 1, timeout=15)
    assert runs == {message: 2}
    assert scalar(conn, "SELECT jsonb_array_length(error_history) FROM courier.dlq") == 2
    # The dead dequeuer's lease is gone with it.
    assert scalar(conn, "SELECT result FROM courier.ack(ARRAY[%s]::bigint[], ARRAY[%s])", (message, lease)) \
        == "not_found"
