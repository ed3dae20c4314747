"""The Python pull consumer (sqlkit.consumer) against a real database: leases kept alive by
heartbeats, batch ack results, redelivery after a consumer is killed, and the peek/receive
loop."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import psycopg
import pytest

from sqlkit import queries
from sqlkit.consumer import Consumer, PulledMessage, ReceivedMessage, ReceiveLoop
from sqlkit.errors import CourierError, DatabaseUnavailable, InvalidInput
from tests import test_roles_and_psql
from tests.helpers import scalar
from tests.tcp_proxy import PostgresProxy

login_as = test_roles_and_psql.login_as  # the fixture, for the test that logs in as the application

TOPIC = "orders"


@pytest.fixture
def topic(conn: psycopg.Connection) -> str:
    conn.execute("SELECT courier.create_endpoint(%s, 'pull', '{}')", (TOPIC,))
    return TOPIC


def enqueue(conn: psycopg.Connection, *payloads: dict) -> list[int]:
    return [scalar(conn, "SELECT courier.enqueue(%s, %s::jsonb)", (TOPIC, psycopg.types.json.Jsonb(p)))
            for p in payloads]


def dequeue_ids(conn: psycopg.Connection, count: int = 10, visibility: int = 30) -> list[int]:
    return [row[0] for row in conn.execute("SELECT id FROM courier.dequeue(%s, %s, %s)",
                                           (TOPIC, count, visibility)).fetchall()]


def test_heartbeats_keep_a_long_worked_message_from_being_redelivered(dsn, conn, topic):
    [message_id] = enqueue(conn, {"n": 1})

    async def work() -> tuple[dict[int, str], list[int], int]:
        stolen: list[int] = []
        async with Consumer(dsn, TOPIC, visibility_timeout=2, heartbeat_interval=0.4) as consumer:
            async for message in consumer:
                assert message.id == message_id
                # Work for twice the visibility timeout while another consumer keeps trying.
                deadline = time.monotonic() + 4
                while time.monotonic() < deadline:
                    stolen += await asyncio.to_thread(dequeue_ids, conn, 10, 2)
                    await asyncio.sleep(0.3)
                return await consumer.ack(message), stolen, consumer.heartbeats
        raise AssertionError("no message")

    results, stolen, heartbeats = asyncio.run(work())
    assert stolen == []
    assert results == {message_id: "acked"}
    assert heartbeats >= 5


def test_without_heartbeats_the_same_wait_would_have_redelivered_it(dsn, conn, topic):
    """The control for the test above: a lease left alone for as long is handed on."""
    [message_id] = enqueue(conn, {"n": 1})
    assert dequeue_ids(conn, 1, 2) == [message_id]
    time.sleep(2.5)
    assert dequeue_ids(conn, 1, 2) == [message_id]


def test_batch_ack_reports_each_id(dsn, conn, topic):
    ids = enqueue(conn, {"n": 1}, {"n": 2}, {"n": 3})

    async def run() -> tuple[dict[int, str], dict[int, str]]:
        async with Consumer(dsn, TOPIC, batch_size=3) as consumer:
            first, second, third = await consumer.dequeue()
            stale = PulledMessage(**{**third.__dict__, "lease": third.lease + 1000})
            unknown = PulledMessage(**{**third.__dict__, "id": 987_654_321})
            results = await consumer.ack([first, second, stale, unknown])
            again = await consumer.ack([first, third])
            return results, again

    results, again = asyncio.run(run())
    assert results == {ids[0]: "acked", ids[1]: "acked", ids[2]: "lease_lost", 987_654_321: "not_found"}
    assert again == {ids[0]: "not_found", ids[2]: "acked"}
    assert dequeue_ids(conn) == []


def test_nack_gives_the_message_back_with_its_error(dsn, conn, topic):
    [message_id] = enqueue(conn, {"n": 1})

    async def run() -> dict[int, str]:
        async with Consumer(dsn, TOPIC) as consumer:
            async for message in consumer:
                return await consumer.nack(message, "upstream 500")
        raise AssertionError("no message")

    assert asyncio.run(run()) == {message_id: "nacked"}
    row = conn.execute("SELECT retry_count, last_error FROM courier.queue WHERE id = %s", (message_id,)).fetchone()
    assert row == (1, "upstream 500")


CONSUMER_SCRIPT = textwrap.dedent("""
    import asyncio, sys, time
    from sqlkit.consumer import Consumer

    async def main():
        async with Consumer(sys.argv[1], "orders", visibility_timeout=2) as consumer:
            async for message in consumer:
                print(message.id, message.lease, flush=True)
                await asyncio.sleep(3600)  # working on it when the kill comes

    asyncio.run(main())
""")


def test_a_consumer_killed_mid_message_sees_it_redelivered(dsn, conn, topic):
    [message_id] = enqueue(conn, {"n": 1})
    child = subprocess.Popen([sys.executable, "-c", CONSUMER_SCRIPT, dsn], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        line = child.stdout.readline()
        held_id, held_lease = map(int, line.split())
        assert held_id == message_id
        time.sleep(1)  # past a heartbeat: the child was extending its lease
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    assert dequeue_ids(conn, 1, 30) == []  # still leased to the dead consumer
    deadline = time.monotonic() + 10
    redelivered: list = []
    while not redelivered and time.monotonic() < deadline:
        time.sleep(0.25)
        redelivered = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1, 30)", (TOPIC,)).fetchall()
    assert [r[0] for r in redelivered] == [message_id]
    assert redelivered[0][1] != held_lease
    # The dead consumer's lease is refused; the new holder's ack is applied.
    assert conn.execute("SELECT result FROM courier.ack(%s, %s)", ([message_id], [held_lease])).fetchall() \
        == [("lease_lost",)]
    assert conn.execute("SELECT result FROM courier.ack(%s, %s)", ([message_id], [redelivered[0][1]])).fetchall() \
        == [("acked",)]


def test_consumer_refuses_bad_settings():
    with pytest.raises(InvalidInput, match="batch_size"):
        Consumer("postgresql://unused", TOPIC, batch_size=0)
    with pytest.raises(InvalidInput, match="visibility_timeout"):
        Consumer("postgresql://unused", TOPIC, visibility_timeout=0)
    with pytest.raises(InvalidInput, match=r"heartbeat_interval .* must be shorter"):
        Consumer("postgresql://unused", TOPIC, visibility_timeout=5, heartbeat_interval=5)
    with pytest.raises(InvalidInput, match="prefetch"):
        Consumer("postgresql://unused", TOPIC, prefetch="yes")


def test_iterating_prefetches_the_next_batch_and_close_gives_it_back(dsn, conn, topic):
    """While the first batch is worked on the second is already leased; when the loop ends
    there, close() hands the second back: due again within a second, no attempt counted,
    not after the 60 s visibility timeout."""
    ids = enqueue(conn, *({"n": n} for n in range(4)))

    async def run() -> tuple[list[int], list[int]]:
        async with Consumer(dsn, TOPIC, batch_size=2, visibility_timeout=60) as consumer:
            async for batch in consumer.batches():
                await consumer.ack(batch)
                for _ in range(100):  # the prefetch runs while this batch is "worked on"
                    if len(consumer.in_flight) == 2:
                        break
                    await asyncio.sleep(0.05)
                return [m.id for m in batch], [m.id for m in consumer.in_flight]
        raise AssertionError("no batch")

    worked, prefetched = asyncio.run(run())
    assert worked == ids[:2] and prefetched == ids[2:]
    deadline = time.monotonic() + 10
    while not (again := dequeue_ids(conn, 10)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert again == ids[2:]
    assert conn.execute("SELECT DISTINCT retry_count FROM courier.queue WHERE id = ANY (%s)",
                        (ids[2:],)).fetchall() == [(0,)]


def test_without_prefetch_nothing_is_leased_beyond_the_batch_in_hand(dsn, conn, topic):
    ids = enqueue(conn, *({"n": n} for n in range(4)))

    async def run() -> list[int]:
        async with Consumer(dsn, TOPIC, batch_size=2, prefetch=False) as consumer:
            async for _batch in consumer.batches():
                await asyncio.sleep(0.3)
                return [m.id for m in consumer.in_flight] + dequeue_ids(conn, 10)
        raise AssertionError("no batch")

    assert asyncio.run(run()) == ids  # its own two, and the other two still there for anyone


def _wait_for(condition, what: str):
    async def waited():
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.02)
    return waited()


def test_an_ack_takes_the_batch_after_next_in_its_own_statement(dsn, conn, topic):
    """Iterating, an ack that settles the batch in hand also dequeues the batch after the one
    already prefetched: when it returns, both are leased. close() gives both back."""
    ids = enqueue(conn, *({"n": n} for n in range(6)))

    async def run() -> tuple[dict[int, str], list[int]]:
        async with Consumer(dsn, TOPIC, batch_size=2, visibility_timeout=60) as consumer:
            async for batch in consumer.batches():
                await _wait_for(lambda: len(consumer.in_flight) == 4, "the next batch was never prefetched")
                results = await consumer.ack(batch)
                return results, sorted(m.id for m in consumer.in_flight)  # no wait: the ack took them
        raise AssertionError("no batch")

    results, held = asyncio.run(run())
    assert results == dict.fromkeys(ids[:2], "acked")
    assert held == ids[2:]
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 0  # given back
    assert conn.execute("SELECT DISTINCT retry_count FROM courier.queue").fetchall() == [(0,)]


def test_acks_of_single_messages_carry_a_dequeue_only_with_the_last_of_the_batch(dsn, conn, topic):
    ids = enqueue(conn, *({"n": n} for n in range(9)))

    async def run() -> list[int]:
        held_after_each = []
        async with Consumer(dsn, TOPIC, batch_size=3, visibility_timeout=60) as consumer:
            async for batch in consumer.batches():
                await _wait_for(lambda: len(consumer.in_flight) == 6, "the next batch was never prefetched")
                for message in batch:
                    assert await consumer.ack(message) == {message.id: "acked"}
                    held_after_each.append(len(consumer.in_flight))
                return held_after_each
        raise AssertionError("no batch")

    # The first two acks leave the batch's last message and the prefetched three; the third
    # takes three more.
    assert asyncio.run(run()) == [5, 4, 6]
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == len(ids) - 3


def test_a_carried_dequeue_never_overtakes_the_prefetch_ahead_of_it(dsn, conn, topic):
    """A consumer hands out its batches in the topic's order even when it acks before the
    prefetch of the next batch has reached the database: the ack's dequeue waits for it.
    Here every plain dequeue (whose transaction has written nothing yet) is held up for half a
    second, so a carried dequeue sent at once would take the head of the topic first."""
    ids = enqueue(conn, *({"n": n} for n in range(6)))

    async def run() -> list[list[int]]:
        async with Consumer(dsn, TOPIC, batch_size=2, visibility_timeout=60) as consumer:
            batches = consumer.batches()
            first = await anext(batches)  # the second's prefetch is scheduled, not yet sent
            conn.execute("""CREATE FUNCTION public.hold_plain_dequeues() RETURNS trigger LANGUAGE plpgsql AS $$
                            BEGIN
                                IF pg_current_xact_id_if_assigned() IS NULL THEN PERFORM pg_sleep(0.5); END IF;
                                RETURN NULL;
                            END $$""")
            conn.execute("CREATE TRIGGER hold_plain_dequeues BEFORE UPDATE ON courier.queue "
                         "FOR EACH STATEMENT EXECUTE FUNCTION public.hold_plain_dequeues()")
            await consumer.ack(first)
            handed_out = [first, await anext(batches), await anext(batches)]
            await batches.aclose()
            return [[m.id for m in batch] for batch in handed_out]

    assert asyncio.run(run()) == [ids[:2], ids[2:4], ids[4:]]


def test_an_ack_never_fails_for_the_dequeue_it_carries(dsn, conn, topic, caplog):
    """The ack and the carried dequeue share a statement. When the dequeue fails (here every
    UPDATE of the queue does, and an ack DELETEs), the ack is sent again on its own and stands;
    the loop dequeues afresh once the fault is gone."""
    ids = enqueue(conn, *({"n": n} for n in range(6)))
    conn.execute("""CREATE FUNCTION public.refuse_updates() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN RAISE EXCEPTION 'injected: no updates'; END $$""")

    async def run() -> tuple[dict[int, str], list[int]]:
        async with Consumer(dsn, TOPIC, batch_size=2, visibility_timeout=60, poll_interval=0.1) as consumer:
            acked: dict[int, str] = {}
            handed_out: list[int] = []
            async for batch in consumer.batches():
                handed_out += [m.id for m in batch]
                if len(handed_out) == 2:
                    await _wait_for(lambda: len(consumer.in_flight) == 4, "the next batch was never prefetched")
                    conn.execute("CREATE TRIGGER refuse_updates BEFORE UPDATE ON courier.queue "
                                 "FOR EACH ROW EXECUTE FUNCTION public.refuse_updates()")
                    with caplog.at_level(logging.DEBUG, logger="courier.consumer"):
                        acked.update(await consumer.ack(batch))
                    conn.execute("DROP TRIGGER refuse_updates ON courier.queue")
                else:
                    acked.update(await consumer.ack(batch))
                if len(handed_out) == len(ids):
                    return acked, handed_out
        raise AssertionError("no batch")

    acked, handed_out = asyncio.run(run())
    assert acked == dict.fromkeys(ids, "acked")
    assert handed_out == ids
    assert "injected: no updates" in caplog.text
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_many_consumers_take_every_message_once_however_they_ack(dsn, conn, topic):
    """Eight consumers at once, half acking each message, half each batch, with the carried
    dequeues racing the prefetches: every message is handed out once and acked once."""
    ids = [scalar(conn, "SELECT courier.enqueue(%s, %s::jsonb)", (TOPIC, json.dumps({"n": n})))
           for n in range(600)]
    handed_out: list[int] = []
    results: list[str] = []

    async def consume(per_message: bool, done: asyncio.Event) -> None:
        async with Consumer(dsn, TOPIC, batch_size=7, visibility_timeout=60, poll_interval=0.05) as consumer:
            async for batch in consumer.batches():
                handed_out.extend(m.id for m in batch)
                await asyncio.sleep(0.001 * (len(handed_out) % 3))
                if per_message:
                    for message in batch:
                        results.extend((await consumer.ack(message)).values())
                else:
                    results.extend((await consumer.ack(batch)).values())
                if len(results) >= len(ids):
                    done.set()

    async def run() -> None:
        done = asyncio.Event()
        consumers = [asyncio.create_task(consume(n % 2 == 0, done)) for n in range(8)]
        try:
            await asyncio.wait_for(done.wait(), 60)
            await asyncio.sleep(0.3)  # time for a message handed out twice to show
        finally:
            for task in consumers:
                task.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)

    asyncio.run(run())
    assert sorted(handed_out) == ids
    assert results == ["acked"] * len(ids)
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_a_consumer_whose_connections_are_killed_fails_that_call_and_goes_on(dsn, conn, topic):
    """A database restart or pg_terminate_backend kills the connection the consumer keeps
    between calls: the call on it fails, and the next takes a new one."""
    ids = enqueue(conn, *({"n": n} for n in range(4)))

    async def run() -> tuple[list[int], dict[int, str]]:
        async with Consumer(dsn, TOPIC, batch_size=2, visibility_timeout=60, prefetch=False) as consumer:
            first = await consumer.dequeue()
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE application_name = 'courier-consumer' AND datname = current_database()")
            with pytest.raises(CourierError):
                await consumer.ack(first)
            second = await consumer.dequeue()
            return [m.id for m in first + second], await consumer.ack(second)

    taken, acked = asyncio.run(run())
    assert taken == ids
    assert acked == dict.fromkeys(ids[2:], "acked")
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 2  # the failed ack's


def test_the_carried_statement_acks_a_lapsed_lease_before_its_dequeue_could_take_it(conn, topic):
    """A message whose lease ran out is due again; the ack in the same statement as a dequeue
    runs first, so the ack stands and the dequeue does not hand the message out again."""
    lapsed, waiting = enqueue(conn, {"n": 1}, {"n": 2})
    lease = scalar(conn, "SELECT lease FROM courier.dequeue(%s, 1, 1)", (TOPIC,))
    time.sleep(1.2)
    rows = conn.execute(queries.query("consumer_ack_and_dequeue"),
                        {"ids": f"{{{lapsed}}}", "leases": f"{{{lease}}}", "topic": TOPIC, "count": 10,
                         "visibility_timeout": 30}).fetchall()
    assert [(row[0], row[1]) for row in rows] == [(None, waiting)]  # acked (no row), and the other taken
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (lapsed,)) == 0


# The peek/receive loop -----------------------------------------------------------------------

async def _noop(_message: ReceivedMessage) -> None:
    return None


@pytest.mark.parametrize(("interval", "warns"), [(0.05, True), (0.1, False), (1.0, False), (10.0, False),
                                                 (30.0, True)])
def test_peek_interval_outside_100ms_to_10s_logs_a_warning(caplog, interval, warns):
    with caplog.at_level(logging.WARNING, logger="courier.consumer"):
        loop = ReceiveLoop("postgresql://unused", TOPIC, _noop, peek_interval=interval)
    assert loop.peek_interval == interval
    warned = [r.getMessage() for r in caplog.records if "peek_interval" in r.getMessage()]
    assert bool(warned) == warns
    if warns:
        assert "outside the recommended 0.1-10 s" in warned[0]


def test_receive_loop_defaults_follow_nservicebus():
    loop = ReceiveLoop("postgresql://unused", TOPIC, _noop)
    assert loop.peek_interval == 1.0
    assert loop.concurrency >= 2
    with pytest.raises(InvalidInput, match="concurrency"):
        ReceiveLoop("postgresql://unused", TOPIC, _noop, concurrency=0)


def test_receive_loop_takes_every_message_once_within_its_concurrency(dsn, conn, topic):
    ids = enqueue(conn, *({"n": n} for n in range(30)))
    seen: list[int] = []
    running = 0
    most = 0

    async def handler(message: ReceivedMessage) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        seen.append(message.id)
        running -= 1

    async def run() -> ReceiveLoop:
        loop = ReceiveLoop(dsn, TOPIC, handler, peek_interval=0.1, concurrency=3, max_records_to_peek=10)
        task = asyncio.create_task(loop.run())
        deadline = time.monotonic() + 20
        while len(seen) < len(ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        loop.stop()
        await asyncio.wait_for(task, 15)
        return loop

    loop = asyncio.run(run())
    assert sorted(seen) == ids
    assert most <= 3
    assert loop.peeks >= 3  # max_records_to_peek=10: at least three rounds for 30 messages
    assert scalar(conn, "SELECT courier.peek(%s)", (TOPIC,)) == 0


def test_a_receive_loop_whose_idle_connections_are_killed_fails_no_call(dsn, conn, topic, caplog):
    """Between rounds the loop's connections sit idle in its pool; a restart or
    pg_terminate_backend kills them there. The next peek and round are lent live ones."""
    seen: list[int] = []

    async def handler(message: ReceivedMessage) -> None:
        seen.append(message.id)

    async def run() -> ReceiveLoop:
        loop = ReceiveLoop(dsn, TOPIC, handler, peek_interval=0.1, concurrency=2)
        task = asyncio.create_task(loop.run())
        first = enqueue(conn, {"n": 1}, {"n": 2})
        await _wait_for(lambda: len(seen) == 2, "the first messages were never received")
        killed = scalar(conn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                              "WHERE application_name = 'courier-receiver' AND datname = current_database()")
        assert killed >= 1
        then = enqueue(conn, {"n": 3}, {"n": 4})
        await _wait_for(lambda: len(seen) == 4, "the messages after the kill were never received")
        loop.stop()
        await asyncio.wait_for(task, 15)
        assert sorted(seen) == first + then
        return loop

    with caplog.at_level(logging.WARNING, logger="courier.consumer"):
        assert asyncio.run(run()).failed == 0
    assert not [r.getMessage() for r in caplog.records if r.name == "courier.consumer"]


def test_a_failing_handler_never_blocks_the_topic_and_its_message_ends_in_the_dlq(dsn, conn):
    conn.execute("""SELECT courier.create_endpoint(%s, 'pull', '{"max_retries": 1}')""", (TOPIC,))
    ids = enqueue(conn, {"n": 1, "poison": True}, {"n": 2}, {"n": 3})
    handled: list[int] = []
    attempts: list[int] = []

    async def handler(message: ReceivedMessage) -> None:
        if message.payload.get("poison"):
            attempts.append(message.id)
            raise RuntimeError("cannot handle this one")
        handled.append(message.id)

    async def run() -> None:
        loop = ReceiveLoop(dsn, TOPIC, handler, peek_interval=0.1, concurrency=1)
        task = asyncio.create_task(loop.run())
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (len(handled) < 2 or len(attempts) < 2):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        loop.stop()
        await asyncio.wait_for(task, 15)

    asyncio.run(run())
    # The two behind it went through while the poison message waited out its back-off.
    assert handled == ids[1:]
    # Tried twice (max_retries 1), then dead-lettered with its error, out of the topic.
    assert attempts == [ids[0], ids[0]]
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (ids[0],)) == 0
    assert conn.execute("SELECT original_topic, last_error FROM courier.dlq WHERE original_message_id = %s",
                        (ids[0],)).fetchone() == (TOPIC, "RuntimeError: cannot handle this one")


def test_stopping_the_loop_is_bounded_and_rolls_back_the_unfinished_receive(dsn, conn, topic):
    # Three waiting, one slot: the loop is both inside a handler and waiting for the slot.
    ids = enqueue(conn, {"n": 1}, {"n": 2}, {"n": 3})

    async def slow(_message: ReceivedMessage) -> None:
        await asyncio.sleep(3600)

    async def run() -> float:
        loop = ReceiveLoop(dsn, TOPIC, slow, peek_interval=0.1, concurrency=1, shutdown_timeout=0.5)
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(1)  # the handler is now sleeping on the first message
        began = time.monotonic()
        loop.stop()
        await asyncio.wait_for(task, 10)
        return time.monotonic() - began

    took = asyncio.run(run())
    assert took < 3
    assert [row[0] for row in conn.execute("SELECT id FROM courier.queue ORDER BY id")] == ids


@pytest.fixture
def proxy(dsn):
    """A proxy in front of the test's database, for a test to stall."""
    proxy = PostgresProxy(dsn)
    yield proxy
    proxy.close()


def test_a_consumer_closes_within_its_bound_when_the_database_stops_answering(conn, topic, proxy):
    """A partition that drops packets: the prefetch in flight and its release hang, and so would
    psycopg's cancellation of them. Closing gives up on them after shutdown_timeout."""
    enqueue(conn, *({"n": n} for n in range(30)))

    async def run() -> float:
        consumer = Consumer(proxy.proxied_dsn, TOPIC, batch_size=10, shutdown_timeout=1)
        async with consumer:
            batches = consumer.batches()
            assert len(await anext(batches)) == 10  # and the next batch is being prefetched
            proxy.stall()
            began = time.monotonic()
            await asyncio.wait_for(batches.aclose(), 30)
        return time.monotonic() - began

    took = asyncio.run(run())
    # The prefetched batch's release (1 s), the heartbeat and listener (at once), the
    # connections (1 s); it hung for good before.
    assert took < 3 + 1, f"closing took {took:.1f} s"


def test_a_running_consumer_fails_a_call_the_database_does_not_answer_and_goes_on(conn, topic, proxy):
    """A partition while the consumer works: its ack fails with a clear error, bounded by
    call_timeout, instead of waiting for TCP to give up; once the network is back it dequeues
    again."""
    enqueue(conn, *({"n": n} for n in range(20)))

    async def run() -> tuple[float, list[PulledMessage]]:
        consumer = Consumer(proxy.proxied_dsn, TOPIC, batch_size=10, call_timeout=1, shutdown_timeout=1,
                            prefetch=False)
        async with consumer:
            batch = await consumer.dequeue()
            proxy.stall()
            began = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="ack: no answer from the database within 1 s"):
                await asyncio.wait_for(consumer.ack(batch), 30)
            took = time.monotonic() - began
            proxy.restore()
            return took, await asyncio.wait_for(consumer.dequeue(), 30)

    took, after = asyncio.run(run())
    # call_timeout, then psycopg's cancellation of the query (a cancel request and a wait, at
    # most 5 s each, both unanswered here) before it closes the connection.
    assert took < 1 + 10 + 1, f"the ack failed after {took:.1f} s"
    assert len(after) == 10  # the other ten, on a connection that works


def test_a_receive_loop_rides_out_a_stalled_database(conn, topic, proxy):
    """Peeks and receives that get no answer fail after call_timeout; the loop keeps peeking
    and, once the network is back, receives every message. A message whose commit was on its
    way when the network stalled may come again (at least once): at most one per slot."""
    ids = enqueue(conn, *({"n": n} for n in range(20)))
    seen: list[int] = []

    async def handler(message: ReceivedMessage) -> None:
        await asyncio.sleep(0.02)
        seen.append(message.id)

    async def run() -> None:
        loop = ReceiveLoop(proxy.proxied_dsn, TOPIC, handler, peek_interval=0.2, concurrency=2,
                           call_timeout=1, shutdown_timeout=1)
        task = asyncio.create_task(loop.run())
        while len(seen) < 3:
            await asyncio.sleep(0.01)
        proxy.stall()
        await asyncio.sleep(2.5)  # past call_timeout: the calls in flight are being cancelled
        assert not task.done()
        proxy.restore()
        deadline = time.monotonic() + 30
        while len(set(seen)) < len(ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        loop.stop()
        await asyncio.wait_for(task, 15)

    asyncio.run(run())
    assert sorted(set(seen)) == ids
    assert len(seen) - len(ids) <= 2


def test_stopping_the_loop_while_a_peek_hangs_is_bounded(topic, proxy):
    async def run() -> float:
        loop = ReceiveLoop(proxy.proxied_dsn, TOPIC, _noop, peek_interval=0.2, shutdown_timeout=1)
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0.5)
        proxy.stall()
        await asyncio.sleep(1)  # a peek is now waiting for an answer that will not come
        began = time.monotonic()
        loop.stop()
        await asyncio.wait_for(task, 30)
        return time.monotonic() - began

    took = asyncio.run(run())
    assert took < 3 + 1, f"stopping took {took:.1f} s"


def test_an_application_role_runs_both_consumers(dsn, conn, topic, login_as):
    app_dsn = login_as("courier_application").info.dsn
    ids = enqueue(conn, {"n": 1}, {"n": 2}, {"n": 3, "poison": True})

    async def consume() -> dict[int, str]:
        async with Consumer(app_dsn, TOPIC, batch_size=1) as consumer:
            async for message in consumer:
                await consumer.extend_leases()
                return await consumer.ack(message)
        raise AssertionError("no message")

    received: list[int] = []

    async def handler(message: ReceivedMessage) -> None:
        if message.payload.get("poison"):
            raise RuntimeError("no")
        received.append(message.id)

    async def receive() -> None:
        loop = ReceiveLoop(app_dsn, TOPIC, handler, peek_interval=0.1, concurrency=1)
        task = asyncio.create_task(loop.run())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not received or loop.failed < 1):
            await asyncio.sleep(0.05)
        loop.stop()
        await asyncio.wait_for(task, 10)

    assert asyncio.run(consume()) == {ids[0]: "acked"}
    asyncio.run(receive())
    assert received == [ids[1]]
    assert conn.execute("SELECT retry_count, last_error FROM courier.queue WHERE id = %s", (ids[2],)).fetchone() \
        == (1, "RuntimeError: no")


JSON_VALUES = [
    {}, {"n": 1}, [], [1, 2.5, -3e-7, 10**30], "text", "", 0, -1.25, True, False, None,
    {"nested": {"deep": [{"a": None}, {"b": [True, "é\u00e9\u2603\U0001F600"]}]}, "quote\"back\\slash": "\n\t\u0001"},
    {"big": 12345678901234567890, "float": 1.0000000000000002, "neg": -0.0, "exp": 1e300},
    {"spaces in key": " lead and trail ", "{}": "{}", "[]": []},
]


@pytest.mark.parametrize("mode", ["consumer", "receive loop"])
def test_payloads_and_metadata_come_back_as_the_database_holds_them(dsn, conn, topic, mode):
    """Every JSON shape, through the consumer's own jsonb decoding, equals what json.loads makes
    of the database's text for the same value: payloads of every type, empty and set metadata."""
    ids = []
    for i, value in enumerate(JSON_VALUES):
        metadata = {} if i % 2 else {"trace": i, "tags": ["a", "ü"]}
        ids.append(scalar(conn, "SELECT courier.enqueue(%s, %s::jsonb, p_metadata => %s::jsonb)",
                          (TOPIC, psycopg.types.json.Jsonb(value), psycopg.types.json.Jsonb(metadata))))
    expected = {row[0]: (json.loads(row[1]), json.loads(row[2])) for row in conn.execute(
        "SELECT id, payload::text, metadata::text FROM courier.queue WHERE id = ANY (%s)", (ids,)).fetchall()}

    async def consume() -> dict[int, tuple[object, object]]:
        got: dict[int, tuple[object, object]] = {}
        if mode == "consumer":
            async with Consumer(dsn, TOPIC, batch_size=100) as consumer:
                batch = await consumer.dequeue()
                assert all(isinstance(m, PulledMessage) and m.lease >= 1 for m in batch)
                got = {m.id: (m.payload, m.metadata) for m in batch}
                assert set((await consumer.ack(batch)).values()) == {"acked"}
            return got

        async def handler(message: ReceivedMessage) -> None:
            got[message.id] = (message.payload, message.metadata)
            if len(got) == len(ids):
                loop.stop()

        loop = ReceiveLoop(dsn, TOPIC, handler, peek_interval=0.1, concurrency=2)
        await asyncio.wait_for(loop.run(), 30)
        return got

    got = asyncio.run(consume())
    assert got == expected
    # Equal and of the same types (1 == 1.0 == True in Python, so compare the JSON text too).
    assert {i: json.dumps(v, sort_keys=True) for i, v in got.items()} == \
        {i: json.dumps(v, sort_keys=True) for i, v in expected.items()}


def test_the_consumer_hands_out_binary_payloads_bodies_and_times_intact(dsn, conn, topic):
    """The consumer reads its batches in PostgreSQL's binary format: bytes, text and times
    arrive as they were stored."""
    blob = bytes(range(256)) * 4
    message_id = scalar(conn, "SELECT courier.enqueue(%s, NULL, p_payload_binary => %s, p_body => %s, "
                              "p_metadata => '{\"k\": [1, 2.5, null]}')", (TOPIC, blob, "héllo\nworld"))
    stored = conn.execute("SELECT created_at FROM courier.queue WHERE id = %s", (message_id,)).fetchone()[0]

    async def run() -> PulledMessage:
        async with Consumer(dsn, TOPIC, batch_size=5) as consumer:
            [message] = await consumer.dequeue()
            await consumer.ack(message)
            return message

    message = asyncio.run(run())
    assert (message.id, message.payload, message.payload_binary, message.body) == (message_id, None, blob,
                                                                                   "héllo\nworld")
    assert message.metadata == {"k": [1, 2.5, None]}
    assert message.created_at == stored and message.visible_until.tzinfo is not None
