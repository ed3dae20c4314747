"""Priority inside one pool (issue 23, item 5): messages pending together when the pool starts
go out highest priority first, whatever number of claims the pool makes and however many it
has claimed ahead of its free slots (the seed: higher priority is dispatched first). What is
promised: within one pool, an endpoint's messages start in priority order, so an endpoint with
one request at a time receives them in that order; ordering keys still come first. Across the
pools of `courier worker --processes N` (or several workers) each pool keeps its own order and
no global order is promised, as in the seed ("cross-worker global ordering is not guaranteed")."""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from itertools import pairwise

import pytest

from console.sink import WebhookSink
from tests.brokers import Broker, require_broker
from tests.helpers import claim, scalar
from tests.workers import run_pool_until, start_worker_process, wait_for


@pytest.fixture
def sink():
    with WebhookSink() as running:
        yield running


def _webhook(conn, url: str, concurrency: int) -> None:
    conn.execute("SELECT courier.create_endpoint('hook', 'http', %s::jsonb)",
                 (json.dumps({"url": url, "allow_internal": True, "concurrency": concurrency}),))


def _send_shuffled(conn, priorities: range, per_priority: int, key_of=None, round_: int = 0) -> int:
    """Send per_priority messages of each priority in a shuffled order, in one transaction, so
    that they are all pending before any claim; each payload says its priority, its number
    within the priority, its key and its round. Returns how many were sent."""
    sends = [(p, n) for p in priorities for n in range(per_priority)]
    random.Random(23 + round_).shuffle(sends)
    with conn.transaction():
        for priority, n in sends:
            key = None if key_of is None else key_of(priority, n)
            conn.execute("SELECT courier.send_with_options('hook', %s::jsonb, p_priority := %s, p_ordering_key := %s)",
                         (json.dumps({"p": priority, "n": n, "key": key, "round": round_}), priority, key))
    return len(sends)


def _received(sink: WebhookSink) -> list[tuple[int, dict]]:
    """(message id, payload) of every request the sink received, in the order it received them."""
    with sink._lock:
        return [(int(request.headers["x-courier-message-id"]), json.loads(request.body)) for request in sink.received]


def _archived(conn) -> int:
    return scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'completed'")


def _non_increasing(priorities: list[int]) -> bool:
    return all(a >= b for a, b in pairwise(priorities))


def test_one_request_at_a_time_receives_every_priority_in_order(dsn, conn, sink):
    """One slot and a prefetch of four: the pool claims two messages at a time, a claim after
    every two deliveries, so with a fast webhook many claims are made while others are still
    in the database. Before the fix two claims were often on their way at once and the
    webhook saw, e.g., 9,9,8,9,9,8 (in about half of the rounds of 440 messages). Four rounds,
    each sent in one transaction once the one before is delivered, to one running pool."""
    rounds, sent = 4, 0

    def next_round_or_done() -> bool:
        nonlocal rounds, sent
        if _archived(conn) < sent:
            return False
        if rounds == 0:
            return True
        rounds -= 1
        sent += _send_shuffled(conn, range(11), 40, round_=rounds)
        return False

    _webhook(conn, sink.url + "/healthy", concurrency=1)
    run_pool_until(dsn, next_round_or_done, timeout=120)
    received = _received(sink)
    assert len(received) == sent == 4 * 440
    for round_ in range(4):
        seen = [payload["p"] for _, payload in received if payload["round"] == round_]
        assert _non_increasing(seen), ",".join(map(str, seen))


def test_ordering_keys_still_come_before_priority(dsn, conn, sink):
    """A key's messages go in the order they were sent whatever their priorities (a key's next
    message waits for the one before it), and the messages without a key keep priority order
    among themselves."""
    _webhook(conn, sink.url + "/healthy", concurrency=1)
    keyed = {2: "a", 5: "b", 8: "c"}  # every message of priorities 2, 5 and 8 has a key
    sent = _send_shuffled(conn, range(11), 10, key_of=lambda p, n: keyed.get(p) and f"{keyed[p]}-{n % 2}")
    run_pool_until(dsn, lambda: _archived(conn) == sent, timeout=120)
    received = _received(sink)
    assert len(received) == sent
    by_key: dict[str, list[int]] = defaultdict(list)
    for message_id, payload in received:
        if payload["key"] is not None:
            by_key[payload["key"]].append(message_id)
    assert len(by_key) == 6
    for key, ids in by_key.items():
        assert ids == sorted(ids), f"key {key} out of send order: {ids}"
    unkeyed = [payload["p"] for _, payload in received if payload["key"] is None]
    assert _non_increasing(unkeyed), ",".join(map(str, unkeyed))


def test_worker_processes_each_keep_their_pools_order(dsn, conn, sink):
    """`courier worker --processes 2`, as a user runs it, with two requests at a time to the
    webhook: each pool has one of them, and each pool's deliveries (told apart by the worker
    id the archive records) are in priority order; the two pools' deliveries interleave, which
    is all that is promised across pools."""
    _webhook(conn, sink.url + "/healthy", concurrency=2)
    worker = start_worker_process(dsn, "--processes", "2", "--worker-id", "w")
    try:
        # Both pools running before the sends commit (at once, in one transaction): on a loaded
        # machine the second pool could start after the first had delivered them all.
        wait_for(lambda: {r[0] for r in conn.execute("SELECT worker_id FROM courier.get_worker_status() "
                                                     "WHERE alive")} == {"w/1", "w/2"}, timeout=60)
        sent = _send_shuffled(conn, range(11), 12)
        wait_for(lambda: _archived(conn) == sent, timeout=120)
    finally:
        worker.terminate()
        worker.wait(30)
    delivered_by = dict(conn.execute("SELECT id, worker_id FROM courier.archive").fetchall())
    by_pool: dict[str, list[int]] = defaultdict(list)
    for message_id, payload in _received(sink):
        by_pool[delivered_by[message_id]].append(payload["p"])
    assert sorted(by_pool) == ["w/1", "w/2"]
    assert sum(map(len, by_pool.values())) == sent
    for pool, seen in by_pool.items():
        assert _non_increasing(seen), f"{pool}: " + ",".join(map(str, seen))


def test_one_request_at_a_time_is_in_order_across_processes_too(dsn, conn, sink):
    """An endpoint allowed one request at a time gets it from one pool only, so
    `courier worker --processes 2` keeps its whole order."""
    _webhook(conn, sink.url + "/healthy", concurrency=1)
    sent = _send_shuffled(conn, range(11), 8)
    worker = start_worker_process(dsn, "--processes", "2")
    try:
        wait_for(lambda: _archived(conn) == sent, timeout=120)
    finally:
        worker.terminate()
        worker.wait(30)
    seen = [payload["p"] for _, payload in _received(sink)]
    assert len(seen) == sent
    assert _non_increasing(seen), ",".join(map(str, seen))


def test_a_broker_endpoint_with_one_message_at_a_time_publishes_in_priority_order(dsn, conn):
    """Broker endpoints publish whole claimed batches; allowed one message at a time, each claim
    takes one and the next waits for its outcome, so a Redis stream holds them in priority order."""
    require_broker("redis")
    broker = Broker.of("redis")
    conn.execute("SELECT courier.create_endpoint('hook', 'redis', %s::jsonb)",
                 (json.dumps({**broker.config(), "concurrency": 1}),))
    sent = _send_shuffled(conn, range(11), 6)
    try:
        run_pool_until(dsn, lambda: _archived(conn) == sent, timeout=60)
        received = asyncio.run(broker.read())
    finally:
        asyncio.run(broker.cleanup())
    seen = [message.payload["p"] for message in received]
    assert len(seen) == sent
    assert _non_increasing(seen), ",".join(map(str, seen))


def test_due_retries_and_schedules_are_claimed_highest_priority_first(conn):
    """Messages whose retry or scheduled time has come are claimed by priority too, not by how
    long they have been due: a priority-10 retry due a moment ago goes before 30 priority-0
    messages due an hour ago, in the first claim of five."""
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, priority, scheduled_at) "
                 "SELECT 1, jsonb_build_object('n', g), 0, now() - interval '1 hour' FROM generate_series(1, 30) g")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, priority, next_retry_at, retry_count) "
                 "VALUES (1, '{\"urgent\": 1}', 10, now() - interval '1 second', 1), "
                 "       (1, '{\"middling\": 1}', 5, now() - interval '2 seconds', 1)")
    later = scalar(conn, "INSERT INTO courier.queue (endpoint_id, payload, priority, scheduled_at) "
                         "VALUES (1, '{}', 10, now() + interval '1 hour') RETURNING id")
    first = claim(conn, 5)
    assert [row[2] for row in first] == [10, 5, 0, 0, 0]
    assert later not in [row[0] for row in first]
