"""A pull topic's plain sends stage (migration 0054, issue 39): while a mover is alive,
`courier.enqueue(topic, payload)` and `courier.send(topic, payload)` write only the stage's narrow
row, and the topic's next dequeue or receive takes it from there, after what the queue holds for
the topic: a dequeued message is written to the queue once, already leased, and a received one
never. Nothing is lost or doubled, leases fence as ever, and a receive that rolls back leaves the
message for its receive loop to report."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tests.helpers import scalar
from tests.test_send_paths import _depth, _row
from tests.test_send_stage import _stage_alive, _staged, _taken_in_stage


@pytest.fixture
def topic(conn: psycopg.Connection) -> str:
    conn.execute("SELECT courier.create_endpoint('t', 'pull', '{}')")
    return "t"


def _enqueue(conn: psycopg.Connection, n: int = 0) -> int:
    return scalar(conn, "SELECT courier.enqueue('t', %s::jsonb)", (f'{{"n": {n}}}',))


def _dequeue(conn: psycopg.Connection, count: int, timeout: int = 30) -> list[tuple]:
    return conn.execute("SELECT id, lease, payload, metadata, retry_count, visible_until > now() "
                        "FROM courier.dequeue('t', %s, %s)", (count, timeout)).fetchall()


def _written(conn: psycopg.Connection) -> tuple[int, int]:
    """Rows inserted into and updated in courier.queue by this backend: the current transaction's
    counts, and the earlier ones' not yet flushed to the statistics. Compare two readings in one
    transaction."""
    return conn.execute("SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables "
                        "WHERE relid = 'courier.queue'::regclass").fetchone()


@pytest.mark.parametrize("call", ["enqueue('t', '{\"n\": 1}')", "send('t', '{\"n\": 1}')"])
def test_a_plain_send_to_a_pull_topic_stages_and_moves_into_the_row_it_would_have_been(conn, topic, call):
    direct = scalar(conn, f"SELECT courier.{call}")  # no mover yet: to the queue
    _stage_alive(conn)
    staged = scalar(conn, f"SELECT courier.{call}")
    assert _staged(conn) == [staged] and _depth(conn, "t") == 1
    assert scalar(conn, "SELECT courier.peek('t')") == 2  # peek sees the stage too
    conn.execute("SELECT courier.keep_send_stage()")  # the leader's move
    assert _staged(conn) == [] and _depth(conn, "t") == 2
    assert _row(conn, staged) == _row(conn, direct)


def test_dequeue_takes_the_queue_first_then_leases_staged_messages_where_they_wait(conn, topic):
    _stage_alive(conn)
    conn.execute("SELECT courier.create_endpoint('p', 'noop', '{}')")
    queued = scalar(conn, "SELECT courier.enqueue('t', '{}', p_metadata => '{\"m\": 1}')")  # not plain: the queue
    staged = [_enqueue(conn, n) for n in range(3)]
    other = scalar(conn, "SELECT courier.send('p', '{}')")
    assert _staged(conn) == [*staged, other]
    with conn.transaction():
        before = _written(conn)
        taken = _dequeue(conn, 3)
        after = _written(conn)
    # The queued one leased in place: an update. Two staged ones leased in the stage (migration
    # 0057), the queue not written for them; the third moved pending. The push endpoint's, fresh,
    # stays staged for its own claim.
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
    assert [row[0] for row in taken] == [queued, *staged[:2]]
    assert all(lease > 0 and visible for _, lease, _, _, _, visible in taken)
    assert [(payload, metadata, retries) for _, _, payload, metadata, retries, _ in taken[1:]] == \
        [({"n": 0}, {}, 0), ({"n": 1}, {}, 0)]
    leases = dict(conn.execute("SELECT id, lease FROM courier.send_stage WHERE visible_until > now()").fetchall())
    assert leases == {staged[0]: taken[1][1], staged[1]: taken[2][1]}
    assert _staged(conn) == [other] and _taken_in_stage(conn) == staged[:2]
    status = dict(conn.execute("SELECT id, status FROM courier.queue").fetchall())
    assert status == {queued: "processing", staged[2]: "pending"}
    assert scalar(conn, "SELECT courier.peek('t')") == 1  # the pending one: leased ones are not due
    # Staged 50 ms ago or more, it is any taker's to move: the next dequeue that looks at the
    # stage (its batch not filled from the queue) moves the push one, and steps over the leases.
    conn.execute("UPDATE courier.send_stage SET created_at = created_at - interval '1 second'")
    assert [row[0] for row in _dequeue(conn, 5)] == [staged[2]]
    assert _staged(conn) == [] and _taken_in_stage(conn) == staged[:2] and _depth(conn, "p") == 1

    # Fenced as any lease: a wrong one changes nothing (the message is then in the queue, still
    # under its lease, which the ack's answer names); the right one acks, from the stage or there.
    first, second = taken[1], taken[2]
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (first[0], first[1] + 1)) == "lease_lost"
    assert conn.execute("SELECT status, lease FROM courier.queue WHERE id = %s", (first[0],)).fetchone() == \
        ("processing", first[1])
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (first[0], first[1])) == "acked"
    depth = _depth(conn, "t")
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (second[0], second[1])) == "acked"
    assert _taken_in_stage(conn) == [] and _depth(conn, "t") == depth  # never counted: never moved
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (second[0], second[1])) == "not_found"
    assert scalar(conn, "SELECT total FROM courier.delivery_totals WHERE outcome = 'delivered'") == 2


def test_a_lease_taken_in_the_stage_lapses_and_settles_as_any_other(conn, topic):
    _stage_alive(conn)
    staged = [_enqueue(conn, n) for n in range(4)]
    taken = _dequeue(conn, 4)
    assert [row[0] for row in taken] == staged and _taken_in_stage(conn) == staged
    # A lapsed lease is due again at the next dequeue, the lost attempt counted.
    conn.execute("UPDATE courier.send_stage SET visible_until = now() - interval '1 second' WHERE id = %s",
                 (staged[0],))
    again = _dequeue(conn, 5)
    assert [row[0] for row in again] == [staged[0]] and again[0][4] == 1 and again[0][1] != taken[0][1]
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (staged[0], taken[0][1])) == "lease_lost"
    # nack, extend and release find a message leased in the stage, and fence it as any other.
    assert scalar(conn, "SELECT courier.nack(%s, %s, 'boom')", (staged[1], taken[1][1] + 1)) == "lease_lost"
    assert scalar(conn, "SELECT courier.nack(%s, %s, 'boom')", (staged[1], taken[1][1])) == "nacked"
    extended = conn.execute("SELECT result FROM courier.extend_lease(%s, %s, 600)",
                            ([staged[2]], [taken[2][1]])).fetchone()[0]
    assert extended == "extended"
    assert scalar(conn, "SELECT courier.release(%s, %s)", ([staged[3]], [taken[3][1]])) is not None
    rows = {row[0]: row[1:] for row in conn.execute(
        "SELECT id, status, retry_count, visible_at > now() + interval '500 seconds' FROM courier.queue")}
    assert rows == {staged[0]: ("processing", 1, False), staged[1]: ("pending", 1, False),
                    staged[2]: ("processing", 0, True), staged[3]: ("pending", 0, False)}
    assert _taken_in_stage(conn) == [] and _depth(conn, "t") == 4


def test_the_leader_moves_a_lease_into_the_queue_with_its_lease(conn, topic):
    """A message stays leased in the stage at most until the leader's next move (each second):
    from there every surface that lists messages in flight sees it, and its ack still acks."""
    _stage_alive(conn)
    message = _enqueue(conn)
    (_, lease, *_), = _dequeue(conn, 1)
    conn.execute("SELECT courier.keep_send_stage()")
    assert _taken_in_stage(conn) == [] and _depth(conn, "t") == 1
    row = conn.execute("SELECT status, lease, visible_at > now() FROM courier.queue WHERE id = %s",
                       (message,)).fetchone()
    assert row == ("processing", lease, True)
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (message, lease)) == "acked"
    assert _depth(conn, "t") == 0


def test_receive_delivers_from_the_stage_without_writing_the_queue(conn, topic):
    _stage_alive(conn)
    staged = [_enqueue(conn, n) for n in range(4)]
    with conn.transaction():
        before = _written(conn)
        got = conn.execute("SELECT id, payload FROM courier.receive('t', 3)").fetchall()
        after = _written(conn)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)  # only the fourth, moved pending
    assert got == [(staged[0], {"n": 0}), (staged[1], {"n": 1}), (staged[2], {"n": 2})]
    assert _staged(conn) == [] and _depth(conn, "t") == 1
    assert scalar(conn, "SELECT total FROM courier.delivery_totals WHERE outcome = 'delivered'") == 3
    assert [r[0] for r in conn.execute("SELECT id FROM courier.receive('t', 5)")] == [staged[3]]


def test_batches_of_plain_payloads_stage_and_batches_with_options_do_not(conn, topic):
    """send_batch and enqueue_batch of plain JSON payloads stage as a single send does (while
    takers keep the stage flowing); an option on any element sends the batch to the queue."""
    _stage_alive(conn)
    sent = scalar(conn, "SELECT courier.send_batch('t', ARRAY['{\"n\": 1}', '{\"n\": 2}']::jsonb[])")
    enqueued = scalar(conn, "SELECT courier.enqueue_batch('t', ARRAY['{\"n\": 3}', '{\"n\": 4}']::jsonb[])")
    assert _staged(conn) == [*sent, *enqueued]
    with_options = scalar(conn, "SELECT courier.enqueue_batch('t', ARRAY['{}']::jsonb[], "
                                "p_metadata => ARRAY['{\"m\": 1}']::jsonb[])")
    assert _staged(conn) == [*sent, *enqueued] and _depth(conn, "t") == 1
    taken = _dequeue(conn, 10)
    assert [row[0] for row in taken] == [*with_options, *sent, *enqueued]  # the queue's first
    assert [row[2] for row in taken[1:]] == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]
    with pytest.raises(psycopg.Error, match="max_payload_size"):
        conn.execute("SELECT courier.set_setting('max_payload_size', '1024')")
        conn.execute("SELECT courier.enqueue_batch('t', ARRAY[%s::jsonb])", ('{"big": "' + "x" * 2000 + '"}',))


def test_an_expired_staged_message_is_not_taken(conn):
    conn.execute("SELECT courier.create_endpoint('t', 'pull', '{\"message_ttl_seconds\": 60}')")
    _stage_alive(conn)
    old, fresh = _enqueue(conn), _enqueue(conn)
    conn.execute("UPDATE courier.send_stage SET created_at = now() - interval '2 minutes' WHERE id = %s", (old,))
    assert [row[0] for row in _dequeue(conn, 5)] == [fresh]
    assert scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (old,)) == "pending"  # for the reaper


def test_a_throughput_limit_counts_what_the_stage_gave(conn):
    conn.execute("SELECT courier.create_endpoint('t', 'pull', '{\"throughput_limit\": 2}')")
    _stage_alive(conn)
    for n in range(5):
        _enqueue(conn, n)
    assert len(_dequeue(conn, 5)) == 2
    assert _dequeue(conn, 5) == []  # the bucket is empty for the rest of the second


def test_a_paused_topic_sends_to_the_queue(conn, topic):
    conn.execute("SELECT courier.pause_endpoint('t')")
    _stage_alive(conn)
    sent = _enqueue(conn)
    assert _staged(conn) == [] and _depth(conn, "t") == 1 and _dequeue(conn, 1) == []
    conn.execute("SELECT courier.resume_endpoint('t')")
    assert [row[0] for row in _dequeue(conn, 1)] == [sent]


def test_a_failed_receive_from_the_stage_is_recorded_as_one_from_the_queue(conn, dsn, topic):
    """The receive loop's protocol: receive, the handler fails, ROLLBACK, then lock_received and
    receive_failed in the next transaction. The message rolled back into the stage; the failure is
    recorded on it all the same, and it is held back for its back-off."""
    _stage_alive(conn)
    message = _enqueue(conn)
    with psycopg.connect(dsn) as loop:
        assert [r[0] for r in loop.execute("SELECT id FROM courier.receive('t', 1)")] == [message]
        loop.rollback()
        assert _staged(conn) == [message]
        assert scalar(loop, "SELECT courier.lock_received('t', %s)", (message,)) == message
        assert scalar(loop, "SELECT courier.receive_failed('t', %s, 'boom')", (message,)) == "retry"
        loop.commit()
    assert _staged(conn) == []
    row = conn.execute("SELECT status, retry_count, last_error, visible_at > now() FROM courier.queue "
                       "WHERE id = %s", (message,)).fetchone()
    assert row == ("pending", 1, "boom", True)
    # A message nobody received is not one to report, staged or not.
    untouched = _enqueue(conn)
    assert scalar(conn, "SELECT courier.receive_failed('t', %s, 'no')", (untouched,)) == "not_found"
    assert _staged(conn) == [untouched]


def test_many_producers_and_consumers_lose_and_double_nothing(conn, dsn, topic):
    """Eight producers enqueue while four consumers dequeue and ack, two receive, and a leader
    keeps the stage alive and moves what is left each half second: every message is delivered
    exactly once, and the counters end at zero."""
    _stage_alive(conn)
    sent: list[int] = []
    delivered: list[int] = []
    lock = threading.Lock()
    sending = threading.Event()
    sending.set()

    def produce() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            mine = [_enqueue(c, n) for n in range(150)]
        with lock:
            sent.extend(mine)

    def consume(receive: bool) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while True:
                still_sending = sending.is_set()
                with c.transaction():
                    if receive:
                        ids = [r[0] for r in c.execute("SELECT id FROM courier.receive('t', 7)")]
                    else:
                        taken = _dequeue(c, 25)
                        ids = [row[0] for row in taken]
                        if taken:
                            results = c.execute("SELECT * FROM courier.ack(%s::bigint[], %s::integer[])",
                                                ([r[0] for r in taken], [r[1] for r in taken])).fetchall()
                            assert {r[1] for r in results} == {"acked"}
                with lock:
                    delivered.extend(ids)
                if not ids and not still_sending:
                    return

    def lead() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while sending.is_set():
                _stage_alive(c)
                time.sleep(0.5)

    producers = [threading.Thread(target=produce) for _ in range(8)]
    consumers = [threading.Thread(target=consume, args=(n < 2,)) for n in range(6)]
    leader = threading.Thread(target=lead)
    leader.start()
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join()
    sending.clear()
    for t in [*consumers, leader]:
        t.join()
    assert len(sent) == 1200 and sorted(delivered) == sorted(sent)
    assert _staged(conn) == [] and _depth(conn, "t") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
