"""Sends and enqueues to a pull topic wake its consumers at commit, with one NOTIFY per topic among
the producers committing together (a NOTIFY in the transaction made them commit one at a time).
A Consumer and `courier serve`'s long polls linger after a wake-up, so the messages of producers
that left their NOTIFY to another arrive without waiting for the poll."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import psycopg
import pytest

from sqlkit.consumer import Consumer
from sqlkit.errors import CourierError
from tests import test_roles_and_psql, test_send_wakeups
from tests.helpers import scalar
from tests.test_serve import start_server, stop_server, token

login_as = test_roles_and_psql.login_as  # the fixture: logs in as a new member of a role
listener = test_send_wakeups.listener  # the fixture: a connection LISTENing on courier_new_msg
payloads = test_send_wakeups.payloads

FALLBACK_POLL = 60.0
"""The Consumer's poll interval here: a message that waited for it would fail the test."""

PROMPTLY = 5.0
"""Seconds a message may take to arrive: generous, and far below the poll and the long poll."""


@pytest.fixture
def topic(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT courier.create_endpoint('orders', 'pull', '{}')")


@pytest.fixture
def slow_commits(dsn: str, conn: psycopg.Connection, topic: int) -> Callable[[], None]:
    """Two producers to the topic, the second of which leaves its NOTIFY to the first and becomes
    visible only after the first's wake-up was answered (test_send_wakeups.two_slow_producers)."""
    return test_send_wakeups.two_slow_producers(dsn, conn, "orders")


def test_sends_and_enqueues_to_a_pull_topic_notify_once_at_commit(dsn, topic, listener):
    with psycopg.connect(dsn) as producer:
        producer.execute("SELECT courier.send('orders', '{}')")
        producer.execute("SELECT courier.send_batch('orders', ARRAY['{}', '{}']::jsonb[])")
        producer.execute("SELECT courier.send_batch_with_options('orders', ARRAY['{}']::jsonb[])")
        producer.execute("SELECT courier.enqueue('orders', '{}')")
        assert payloads(listener) == []  # nothing yet: a NOTIFY here would serialise the commits
        producer.commit()
    assert payloads(listener) == [str(topic)]


def test_scheduled_enqueues_do_not_notify_until_a_keyed_one_brings_them_forward(conn, topic, listener):
    conn.execute("SELECT courier.enqueue('orders', '{\"v\": 1}', p_key := 'k', "
                 "p_scheduled_at := now() + interval '1 hour')")
    assert payloads(listener) == []
    # Replaced in place: no depth counter moves, so the enqueue itself wakes the consumers.
    conn.execute("SELECT courier.enqueue('orders', '{\"v\": 2}', p_key := 'k', p_scheduled_at := now())")
    assert payloads(listener) == [str(topic)]
    # Replaced again with its due time kept: nothing new to wake anyone for.
    conn.execute("SELECT courier.enqueue('orders', '{\"v\": 3}', p_key := 'k')")
    assert payloads(listener) == []
    assert scalar(conn, "SELECT payload ->> 'v' FROM courier.queue") == "3"


def test_topic_id_and_topic_sends_committing_answer_the_application_role_for_pull_topics_only(
        dsn, conn, topic, login_as):
    conn.execute("SELECT courier.create_endpoint('sink', 'noop', '{}')")
    app = login_as("courier_application")
    committing = "SELECT courier.topic_sends_committing(%s)"
    assert scalar(app, committing, ("orders",)) is False
    with psycopg.connect(dsn, autocommit=True) as producer:  # what a committing producer holds
        producer.execute("SELECT pg_advisory_lock_shared(hashtext('courier.sends_committing'), %s)", (topic,))
        assert scalar(app, committing, ("orders",)) is True
        assert scalar(app, committing, ("no-such-topic",)) is False
        assert scalar(app, committing, ("sink",)) is False  # a push endpoint is not a topic
        # Released here, not by closing: a closed connection's backend lets go a moment later.
        producer.execute("SELECT pg_advisory_unlock_shared(hashtext('courier.sends_committing'), %s)", (topic,))
    assert scalar(app, committing, ("orders",)) is False
    assert scalar(app, "SELECT courier.topic_id('orders')") == topic  # what its notifications carry
    assert scalar(app, "SELECT courier.topic_id('sink')") is None
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute("SELECT courier.sends_committing(%s)", (topic,))  # ids are not the application's


def consume(dsn: str, expected: int, ready: threading.Event) -> tuple[list[Any], float]:
    """A Consumer polling only every FALLBACK_POLL seconds takes `expected` messages after one
    that proves it listens (then `ready` is set), acking each; returns their payloads and the
    time.monotonic() of the last."""
    async def run() -> tuple[list[Any], float]:
        got: list[Any] = []
        async with Consumer(dsn, "orders", poll_interval=FALLBACK_POLL) as consumer:
            async for message in consumer:
                await consumer.ack(message)
                if not ready.is_set():
                    ready.set()
                    continue
                got.append(message.payload)
                if len(got) == expected:
                    return got, time.monotonic()
        return got, time.monotonic()

    return asyncio.run(asyncio.wait_for(run(), 30))


def test_a_consumer_takes_the_message_of_a_producer_that_left_its_notify_to_another(dsn, conn, topic,
                                                                                  slow_commits):
    ready = threading.Event()
    result: list[Any] = []
    consumer = threading.Thread(target=lambda: result.append(consume(dsn, 2, ready)))
    consumer.start()
    conn.execute("SELECT courier.send('orders', '{}')")
    assert ready.wait(10)
    started = time.monotonic()
    slow_commits()
    consumer.join(30)
    got, finished = result[0]
    assert sorted(p["n"] for p in got) == [1, 2]
    assert finished - started < PROMPTLY, "the second producer's message waited for the poll"


def test_a_consumer_takes_every_message_of_many_producers_committing_at_once(dsn, conn, topic):
    producers, rounds = 8, 12
    ready = threading.Event()
    result: list[Any] = []
    consumer = threading.Thread(target=lambda: result.append(consume(dsn, producers * rounds, ready)))
    consumer.start()
    conn.execute("SELECT courier.send('orders', '{}')")
    assert ready.wait(10)
    connections = [psycopg.connect(dsn, autocommit=True) for _ in range(producers)]
    try:
        for round_ in range(rounds):
            start = threading.Barrier(producers)

            def produce(connection: psycopg.Connection, n: int, start: threading.Barrier = start) -> None:
                start.wait()
                connection.execute("SELECT courier.send('orders', %s::jsonb)", (f'{{"n": {n}}}',))

            threads = [threading.Thread(target=produce, args=(c, round_ * producers + i))
                       for i, c in enumerate(connections)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            time.sleep(0.05)
        started = time.monotonic()
        consumer.join(30)
    finally:
        for connection in connections:
            connection.close()
    got, finished = result[0]
    assert sorted(p["n"] for p in got) == list(range(producers * rounds))
    assert finished - started < PROMPTLY


@pytest.mark.parametrize("waiting_at_notify", [True, False], ids=["poll-waiting", "poll-arriving-after"])
def test_long_polls_take_the_message_of_a_producer_that_left_its_notify_to_another(
        dsn, conn, topic, slow_commits, waiting_at_notify):
    """poll-waiting: the first producer's NOTIFY wakes a waiting poll, and the client polls again
    at once, before the second producer's commit is visible. poll-arriving-after: no poll waits
    at the NOTIFY, and the first poll arrives just after it. Either way the server's linger wakes
    the poll when the second commit is done, not the long poll's 20 s timeout."""
    secret = token(conn, "app", ["consume"])
    process, base = start_server(dsn)
    try:
        async def main() -> tuple[list[Any], float]:
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as session:
                async def poll() -> list[Any]:
                    async with session.post(base + "/api/messages/dequeue",
                                            json={"topic": "orders", "count": 10, "wait_seconds": 20}) as response:
                        assert response.status == 200
                        return (await response.json())["messages"]

                got: list[Any] = []
                if waiting_at_notify:
                    first = asyncio.create_task(poll())
                    await asyncio.sleep(0.5)
                producing = asyncio.create_task(asyncio.to_thread(slow_commits))
                started = time.monotonic()
                if waiting_at_notify:
                    got += await first
                else:
                    with psycopg.connect(dsn, autocommit=True) as watcher:  # until the first commit
                        while scalar(watcher, "SELECT count(*) FROM courier.queue") == 0:
                            await asyncio.sleep(0.005)
                while len(got) < 2 and time.monotonic() - started < 25:
                    got += await poll()
                await producing
                return got, time.monotonic() - started

        got, took = asyncio.run(main())
    finally:
        assert "Traceback" not in stop_server(process)
    assert len(got) == 2
    assert took < PROMPTLY, f"the second message took {took:.1f} s: it waited for the long poll's timeout"


def test_a_consumer_sleeps_through_other_endpoints_notifications(dsn, conn, topic):
    """An idle Consumer dequeues (and lingers) on its own topic's notifications only: a busy push
    endpoint in the same database costs it nothing."""
    conn.execute("SELECT courier.create_endpoint('sink', 'noop', '{}')")

    class CountingConsumer(Consumer):
        dequeues = 0

        async def dequeue(self, count: int | None = None) -> list[Any]:
            self.dequeues += 1
            return await super().dequeue(count)

    async def main() -> tuple[int, int, float]:
        async with CountingConsumer(dsn, "orders", poll_interval=FALLBACK_POLL) as consumer:
            messages = aiter(consumer)
            first: asyncio.Future[Any] = asyncio.ensure_future(anext(messages))
            await asyncio.sleep(0.5)  # its first dequeue found nothing: it waits now
            idle = consumer.dequeues
            for _ in range(20):  # each commits on its own, and NOTIFYs the sink's id
                await asyncio.to_thread(conn.execute, "SELECT courier.send('sink', '{}')")
            await asyncio.sleep(0.5)
            after_others = consumer.dequeues
            sent = time.monotonic()
            await asyncio.to_thread(conn.execute, "SELECT courier.enqueue('orders', '{\"n\": 1}')")
            message = await asyncio.wait_for(first, PROMPTLY)
            took = time.monotonic() - sent
            await consumer.ack(message)
            await messages.aclose()
            return idle, after_others, took

    idle, after_others, took = asyncio.run(main())
    assert after_others == idle == 1
    assert took < PROMPTLY


def test_a_consumer_that_fails_to_open_leaves_no_connections_behind(dsn, conn, topic):
    conn.execute("DROP FUNCTION courier.topic_id(text)")  # a schema older than the consumer

    async def open_it() -> None:
        async with Consumer(dsn, "orders"):
            pass

    with pytest.raises(CourierError, match="topic_id"):
        asyncio.run(open_it())
    # A backend leaves pg_stat_activity a moment after its client has closed the connection.
    deadline = time.monotonic() + 5
    while (left := scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'courier-consumer' "
                                "AND datname = current_database()")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == 0
