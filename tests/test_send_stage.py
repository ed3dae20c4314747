"""The send stage (migration 0054): while a mover is alive, a single send of a plain message to a
push endpoint waits in courier.send_stage, and the next claim (or the maintenance leader) moves it
into the queue as the row a send to the queue makes. Nothing is lost or doubled on the way, and
every verb that finds messages by endpoint or id sees staged ones."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests.helpers import archived, complete, message_status, scalar
from tests.test_send_paths import _depth, _row
from tests.workers import start_worker_process, wait_for


def _stage_alive(conn: psycopg.Connection) -> None:
    """What the maintenance leader does every second."""
    conn.execute("SELECT courier.keep_send_stage()")
    conn.execute("SELECT courier.estimate_active_messages()")


def _staged(conn: psycopg.Connection) -> list[int]:
    """The messages waiting in the stage for a taker."""
    return [r[0] for r in conn.execute("SELECT id FROM courier.send_stage WHERE lease IS NULL ORDER BY id")]


def _taken_in_stage(conn: psycopg.Connection) -> list[int]:
    """The messages a claim or a dequeue took where they waited (migrations 0057 and 0058), until
    they are acked or reported, or the leader moves them into the queue."""
    return [r[0] for r in conn.execute("SELECT id FROM courier.send_stage WHERE lease IS NOT NULL ORDER BY id")]


def _claim(conn: psycopg.Connection, endpoint: str, batch: int = 10) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT c.id FROM courier.claim_batch('w', %s, (SELECT id FROM courier.endpoints WHERE name = %s)) c",
        (batch, endpoint))]


@pytest.mark.parametrize("config", ["{}", '{"message_ttl_seconds": 600}'])
def test_a_staged_send_becomes_the_row_a_send_to_the_queue_makes(conn, config):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', %s::jsonb)", (config,))
    direct = scalar(conn, "SELECT courier.send('e', '{\"n\": 1}')")  # no mover yet: to the queue
    assert _staged(conn) == []
    _stage_alive(conn)
    staged = scalar(conn, "SELECT courier.send('e', '{\"n\": 1}')")
    assert _staged(conn) == [staged] and staged > direct
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (staged,)) == 0
    assert _depth(conn, "e") == 1  # counted when it is moved
    created = scalar(conn, "SELECT created_at FROM courier.send_stage WHERE id = %s", (staged,))

    assert _claim(conn, "e") == [direct, staged]  # in id order: the queue's, then the stage's
    # Claimed where it waits (migration 0058), counted once the leader moves it into the queue as
    # the row the claim of a queued message leaves.
    assert _staged(conn) == [] and _taken_in_stage(conn) == [staged] and _depth(conn, "e") == 1
    conn.execute("SELECT courier.keep_send_stage()")
    assert _taken_in_stage(conn) == []
    assert scalar(conn, "SELECT created_at FROM courier.queue WHERE id = %s", (staged,)) == created
    moved, sent = _row(conn, staged), _row(conn, direct)
    kept = lambda row: {k: v for k, v in row.items() if k not in ("lease", "processing_started_at", "updated_at")}  # noqa: E731
    assert kept(moved) == kept(sent)
    assert _depth(conn, "e") == 2
    complete(conn, [direct, staged])
    assert message_status(conn, staged) == "completed" and _depth(conn, "e") == 0


def _depth_of(conn: psycopg.Connection, endpoint: str, status: str) -> int:
    return scalar(conn, "SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d "
                        "JOIN courier.endpoints e ON e.id = d.endpoint_id WHERE e.name = %s AND d.status = %s",
                  (endpoint, status))


def _queue_writes(conn: psycopg.Connection) -> tuple[int, int]:
    """Rows inserted into and updated in courier.queue by this backend: the current transaction's
    counts and earlier ones' not yet flushed to the statistics. Compare two readings in one
    transaction."""
    return conn.execute("SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables "
                        "WHERE relid = 'courier.queue'::regclass").fetchone()


def _age_stage(conn: psycopg.Connection) -> None:
    """What 50 ms do to the stage: its messages become every taker's to move."""
    conn.execute("UPDATE courier.send_stage SET created_at = created_at - interval '1 second'")


def test_a_claim_takes_its_staged_messages_straight_into_processing_and_leaves_others_fresh_ones(conn):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('f', 'noop', '{}')")
    _stage_alive(conn)
    e1, f1, e2, e3 = (scalar(conn, "SELECT courier.send(%s, '{}')", (name,)) for name in "efee")
    with conn.transaction():
        before = _queue_writes(conn)
        claimed = conn.execute("SELECT c.id, c.lease FROM courier.claim_batch('w', 2, "
                               "(SELECT id FROM courier.endpoints WHERE name = 'e')) c").fetchall()
        after = _queue_writes(conn)
    # The two claimed where they wait (migration 0058): the queue is not written for them. The
    # third, past the batch, moved pending: written once, never inserted and then updated.
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)
    assert [i for i, _ in claimed] == [e1, e2] and all(lease > 0 for _, lease in claimed)
    assert _staged(conn) == [f1]  # another endpoint's, fresh: left for its own claim
    assert _taken_in_stage(conn) == [e1, e2]
    assert [message_status(conn, m) for m in (e1, e2, e3)] == ["processing", "processing", "pending"]
    assert scalar(conn, "SELECT worker_id FROM courier.send_stage WHERE id = %s", (e1,)) == "w"
    assert (_depth_of(conn, "e", "processing"), _depth_of(conn, "e", "pending"), _depth(conn, "f")) == (0, 1, 0)
    # Fenced like any claim: a report that names another lease changes nothing.
    wrong = conn.execute("SELECT stale FROM courier.report_outcomes(%s, %s, %s, %s)",
                         ([e1], [claimed[0][1] + 1], ["success"], [None])).fetchone()[0]
    assert wrong == 1 and message_status(conn, e1) == "processing"
    # Untouched where the claim took it, under the worker and lease the claim gave it.
    assert conn.execute("SELECT worker_id, lease FROM courier.send_stage WHERE id = %s", (e1,)).fetchone() == \
        ("w", claimed[0][1])
    complete(conn, [e1, e2])
    assert message_status(conn, e1) == "completed" and _depth(conn, "e") == 1
    assert _claim(conn, "f") == [f1] and _claim(conn, "e") == [e3]


def test_a_claim_taken_in_the_stage_settles_as_any_claim(conn):
    """Every push verb finds a message claimed where it waited (migration 0058), fenced by its
    lease: failures, releases and renewals move it into the queue first and settle it there."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    _stage_alive(conn)
    sent = [scalar(conn, "SELECT courier.send('e', '{}')") for _ in range(4)]
    claimed = conn.execute("SELECT c.id, c.lease FROM courier.claim_batch('w', 4, "
                           "(SELECT id FROM courier.endpoints WHERE name = 'e')) c").fetchall()
    assert [i for i, _ in claimed] == sent and _taken_in_stage(conn) == sent
    ids, leases = [i for i, _ in claimed], [lease for _, lease in claimed]
    outcome = conn.execute("SELECT delivered, retried, stale FROM courier.report_outcomes(%s, %s, %s, %s)",
                           (ids[:2], leases[:2], ["success", "retryable"], [None, "HTTP 503"])).fetchone()
    assert outcome == (1, 1, 0)
    assert message_status(conn, ids[0]) == "completed"
    retried = conn.execute("SELECT status, retry_count, last_error FROM courier.queue WHERE id = %s",
                           (ids[1],)).fetchone()
    assert retried == ("pending", 1, "HTTP 503")
    assert scalar(conn, "SELECT courier.renew_leases(%s, %s)", ([ids[2]], [leases[2] + 1])) == 0  # not its lease
    assert scalar(conn, "SELECT courier.renew_leases(%s, %s)", ([ids[2]], [leases[2]])) == 1
    assert conn.execute("SELECT status, worker_id, processing_started_at IS NOT NULL FROM courier.queue "
                        "WHERE id = %s", (ids[2],)).fetchone() == ("processing", "w", True)
    assert scalar(conn, "SELECT courier.release_batch(%s, %s)", ([ids[3]], [leases[3]])) == 1
    assert message_status(conn, ids[3]) == "pending" and _taken_in_stage(conn) == []
    assert (_depth_of(conn, "e", "pending"), _depth_of(conn, "e", "processing")) == (2, 1)


def test_a_dead_workers_claims_in_the_stage_are_recovered_once_the_leader_moves_them(conn):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    _stage_alive(conn)
    sent = scalar(conn, "SELECT courier.send('e', '{}')")
    assert _claim(conn, "e") == [sent] and _taken_in_stage(conn) == [sent]
    conn.execute("SELECT courier.keep_send_stage()")
    assert conn.execute("SELECT status, worker_id FROM courier.queue WHERE id = %s", (sent,)).fetchone() == \
        ("processing", "w")
    conn.execute("UPDATE courier.queue SET processing_started_at = now() - interval '1 hour' WHERE id = %s", (sent,))
    assert scalar(conn, "SELECT courier.recover_stale_messages(60)") == 1
    assert message_status(conn, sent) == "pending" and _claim(conn, "e") == [sent]


def test_a_claim_moves_what_has_waited_50_ms_for_its_own_claim(conn):
    """Messages staged 50 ms ago or more are every taker's to move, pending: the stage stays a
    moment deep even when an endpoint's own claims stop."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('f', 'noop', '{}')")
    _stage_alive(conn)
    e1, f1, e2 = (scalar(conn, "SELECT courier.send(%s, '{}')", (name,)) for name in "efe")
    _age_stage(conn)
    assert _claim(conn, "e", batch=1) == [e1]
    assert _staged(conn) == []
    assert [message_status(conn, m) for m in (e1, e2, f1)] == ["processing", "pending", "pending"]
    assert (_depth_of(conn, "e", "pending"), _depth(conn, "f")) == (1, 1)
    assert _claim(conn, "f") == [f1] and _claim(conn, "e") == [e2]


def test_what_the_queue_holds_for_the_endpoint_is_claimed_before_staged_messages(conn):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    _stage_alive(conn)
    staged = scalar(conn, "SELECT courier.send('e', '{}')")
    urgent = scalar(conn, "SELECT courier.send_with_options('e', '{}', p_priority => 5)")
    assert _staged(conn) == [staged]
    assert _claim(conn, "e", batch=1) == [urgent]
    assert _staged(conn) == [] and message_status(conn, staged) == "pending"  # moved, for the next claim
    assert _claim(conn, "e", batch=1) == [staged]


def test_a_staged_message_that_expired_on_the_stage_is_not_claimed(conn):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{\"message_ttl_seconds\": 5}')")
    _stage_alive(conn)
    old = scalar(conn, "SELECT courier.send('e', '{}')")
    fresh = scalar(conn, "SELECT courier.send('e', '{}')")
    conn.execute("UPDATE courier.send_stage SET created_at = now() - interval '10 seconds' WHERE id = %s", (old,))
    assert _claim(conn, "e") == [fresh]
    assert message_status(conn, old) == "pending"  # moved with its expiry, for the reaper
    conn.execute("SELECT courier.mark_expired_messages()")
    assert message_status(conn, old) == "expired"
    assert (_depth_of(conn, "e", "pending"), _depth_of(conn, "e", "processing")) == (0, 0)  # fresh: in the stage


def test_the_leader_moves_what_no_claim_took_and_sends_stop_staging_without_it(conn):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    _stage_alive(conn)
    first = scalar(conn, "SELECT courier.send('e', '{}')")
    conn.execute("SELECT courier.keep_send_stage()")
    assert _staged(conn) == [] and message_status(conn, first) == "pending" and _depth(conn, "e") == 1
    # The leader gone for longer than its word: sends go to the queue, counted at once.
    conn.execute("UPDATE courier.send_limits SET stage_until = now() - interval '1 second'")
    second = scalar(conn, "SELECT courier.send('e', '{}')")
    assert _staged(conn) == [] and message_status(conn, second) == "pending" and _depth(conn, "e") == 2


@pytest.mark.parametrize("protocol, config", [("noop", '{"delay_seconds": 30}'), ("pull", '{"delay_seconds": 30}'),
                                              ("noop", '{"max_depth": 5}'), ("pull", '{"max_depth": 5}')])
def test_what_a_stage_cannot_honour_goes_to_the_queue(conn, protocol, config):
    """A delayed message is not due, and max_depth is exact: neither stages (a pull topic's plain
    sends do: tests/test_pull_stage.py)."""
    conn.execute("SELECT courier.create_endpoint('e', %s, %s::jsonb)", (protocol, config))
    _stage_alive(conn)
    sent = scalar(conn, "SELECT courier.send('e', '{}')")
    assert _staged(conn) == [] and message_status(conn, sent) == "pending" and _depth(conn, "e") == 1


def test_a_paused_endpoint_takes_its_sends_into_the_queue(conn):
    """No claim comes for a paused endpoint to move its staged sends: they go to the queue, counted
    at once, as a paused endpoint's sends always were."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    conn.execute("SELECT courier.pause_endpoint('e')")
    _stage_alive(conn)
    sent = scalar(conn, "SELECT courier.send('e', '{}')")
    assert _staged(conn) == [] and message_status(conn, sent) == "pending" and _depth(conn, "e") == 1


def test_a_full_queue_or_a_big_payload_takes_the_exact_path(conn):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    conn.execute("SELECT courier.set_setting('max_queue_size', '2')")
    conn.execute("SELECT courier.set_setting('max_payload_size', '1024')")
    _stage_alive(conn)  # an empty queue: room_until leaves room for a moment
    assert scalar(conn, "SELECT room_until > now() FROM courier.send_limits")
    conn.execute("SELECT courier.send('e', '{}')")
    with pytest.raises(psycopg.Error, match="max_payload_size"):
        conn.execute("SELECT courier.send('e', %s::jsonb)", ('{"big": "' + "x" * 2000 + '"}',))
    conn.execute("SELECT courier.keep_send_stage()")
    conn.execute("SELECT courier.estimate_active_messages()")  # 1 of 2: no fast answer any more
    conn.execute("SELECT courier.send('e', '{}')")
    assert _staged(conn) == []
    with pytest.raises(psycopg.Error, match="max_queue_size"):
        conn.execute("SELECT courier.send('e', '{}')")
    assert _depth(conn, "e") == 2


def test_a_rolled_back_staged_send_leaves_nothing(conn, dsn):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    _stage_alive(conn)
    with psycopg.connect(dsn) as other:
        sent = scalar(other, "SELECT courier.send('e', '{}')")
        assert _staged(other) == [sent]
        other.rollback()
    assert _staged(conn) == [] and _claim(conn, "e") == [] and _depth(conn, "e") == 0


def test_verbs_that_find_messages_see_staged_ones(conn):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('f', 'noop', '{}')")
    _stage_alive(conn)
    cancelled, deleted, *purged = [scalar(conn, "SELECT courier.send('e', '{}')") for _ in range(5)]
    kept = scalar(conn, "SELECT courier.send('f', '{}')")
    assert len(_staged(conn)) == 6
    assert conn.execute("SELECT was FROM courier.cancel_message(%s)", (cancelled,)).fetchone()[0] == "pending"
    assert message_status(conn, cancelled) == "cancelled"
    staged_again = scalar(conn, "SELECT courier.send('e', '{}')")
    assert _staged(conn) == [staged_again]
    conn.execute("SELECT * FROM courier.delete_message(%s)", (deleted,))
    assert message_status(conn, deleted) is None
    assert scalar(conn, "SELECT courier.purge_queue_count('e')") == 4
    assert scalar(conn, "SELECT courier.purge_queue('e')") == 4
    assert {message_status(conn, m) for m in [*purged, staged_again]} == {"purged"}
    assert _depth(conn, "e") == 0 and message_status(conn, kept) == "pending"
    late = scalar(conn, "SELECT courier.send('f', '{}')")
    with pytest.raises(psycopg.Error, match="active message"):
        conn.execute("SELECT courier.drop_endpoint('f')")
    conn.execute("SELECT courier.drop_endpoint('f', true)")
    assert _staged(conn) == [] and message_status(conn, late) is None


@pytest.mark.parametrize("batch", [1, 10])
def test_concurrent_senders_and_claims_lose_and_double_nothing(conn, dsn, batch):
    """Eight producers send (one at a time, or send_batch of ten) while four claimers move and
    claim: every message is claimed exactly once, and the counters end at zero."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    _stage_alive(conn)
    sent: list[int] = []
    claimed: list[int] = []
    lock = threading.Lock()
    sending = threading.Event()
    sending.set()

    def produce() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            if batch == 1:
                mine = [scalar(c, "SELECT courier.send('e', %s::jsonb)", (f'{{"n": {n}}}',)) for n in range(150)]
            else:
                mine = [i for n in range(0, 150, batch) for i in scalar(
                    c, "SELECT courier.send_batch('e', %s::jsonb[])", ([f'{{"n": {n + k}}}' for k in range(batch)],))]
        with lock:
            sent.extend(mine)

    def consume() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while True:
                still_sending = sending.is_set()
                with c.transaction():
                    ids = _claim(c, "e", 25)
                    if ids:
                        complete(c, ids)
                with lock:
                    claimed.extend(ids)
                if not ids and not still_sending:
                    return

    producers = [threading.Thread(target=produce) for _ in range(8)]
    consumers = [threading.Thread(target=consume) for _ in range(4)]
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join()
    sending.clear()
    for t in consumers:
        t.join()
    assert len(sent) == 1200 and sorted(claimed) == sorted(sent)
    assert _staged(conn) == [] and _depth(conn, "e") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'completed'") == 1200


def test_a_worker_keeps_the_stage_alive_and_delivers_every_staged_send(dsn, conn):
    """A real `courier worker`: its leader says the stage is alive, producers' sends stage, and
    the worker's claims move and deliver every one. Killed with -9 while sends keep staging, it
    leaves them in the stage; the stage lapses, sends go to the queue, and the next worker
    moves what was left and delivers everything exactly once to the archive."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    worker = start_worker_process(dsn, "--concurrency", "20")
    try:
        wait_for(lambda: scalar(conn, "SELECT stage_until > now() AND room_until > now() FROM courier.send_limits"))
        with conn.transaction():  # staged, as its own transaction sees before it commits
            first = [scalar(conn, "SELECT courier.send('e', '{}')")]
            assert _staged(conn) == first
        first += [scalar(conn, "SELECT courier.send('e', %s::jsonb)", (f'{{"n": {n}}}',)) for n in range(199)]
        wait_for(lambda: archived(conn) == 200, timeout=30)
        worker.kill()
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    left = [scalar(conn, "SELECT courier.send('e', '{}')") for _ in range(20)]
    assert set(_staged(conn)) <= set(left)
    wait_for(lambda: not scalar(conn, "SELECT stage_until > now() FROM courier.send_limits"), timeout=15)
    direct = scalar(conn, "SELECT courier.send('e', '{}')")
    assert direct not in _staged(conn) and message_status(conn, direct) == "pending"
    successor = start_worker_process(dsn)
    try:
        wait_for(lambda: archived(conn) == 221, timeout=30)
    finally:
        successor.terminate()
        successor.wait(30)
    assert _staged(conn) == [] and _depth(conn, "e") == 0
    assert scalar(conn, "SELECT count(DISTINCT id) FROM courier.archive WHERE id = ANY (%s)",
                  ([*first, *left, direct],)) == 221


def test_a_staged_send_wakes_the_workers_at_commit_whatever_the_transaction_sends_after(conn, dsn):
    """The wake-up a staged send asks for stands when a later send of the same transaction, to a
    delayed endpoint, asks for none; and a transaction that staged nothing wakes no one."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('later', 'noop', '{\"delay_seconds\": 60}')")
    endpoint = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'e'")
    _stage_alive(conn)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN courier_new_msg")
        with psycopg.connect(dsn) as producer:
            producer.execute("SELECT courier.send('e', '{}')")
            producer.execute("SELECT courier.send('later', '{}')")
            assert _staged(producer) and message_status(producer, scalar(
                producer, "SELECT max(id) FROM courier.queue")) == "pending"
            producer.commit()
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert woken == [str(endpoint)]
        with psycopg.connect(dsn) as producer:
            producer.execute("SELECT courier.send('later', '{}')")
            producer.commit()
        assert list(listener.notifies(timeout=1, stop_after=1)) == []


def _send_batch(conn: psycopg.Connection, endpoint: str, count: int, priority: int | None = None) -> list[int]:
    payloads = [f'{{"n": {n}}}' for n in range(count)]
    if priority is None:
        return scalar(conn, "SELECT courier.send_batch(%s, %s::jsonb[])", (endpoint, payloads))
    return scalar(conn, "SELECT courier.send_batch_with_priority(%s, %s::jsonb[], %s)", (endpoint, payloads, priority))


def test_a_batch_stages_and_wakes_the_workers_once_at_commit(conn, dsn):
    """send_batch stages as a single send does (migration 0055): its ids come in element order,
    a claim takes them oldest first straight into processing and moves the rest, and the batch
    wakes the endpoint's workers once, at commit, as a batch sent to the queue does."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    endpoint = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'e'")
    _stage_alive(conn)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN courier_new_msg")
        with psycopg.connect(dsn) as producer:
            ids = _send_batch(producer, "e", 5)
            assert ids == sorted(ids) and _staged(producer) == ids
            assert list(listener.notifies(timeout=0.5, stop_after=1)) == []  # not before the commit
            producer.commit()
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=2)] == [str(endpoint)]
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0 and _depth(conn, "e") == 0
    assert _claim(conn, "e", batch=3) == ids[:3]
    assert _staged(conn) == [] and [message_status(conn, m) for m in ids] == ["processing"] * 3 + ["pending"] * 2
    assert _taken_in_stage(conn) == ids[:3]  # counted once moved: only the two pending ones are
    assert (_depth_of(conn, "e", "pending"), _depth_of(conn, "e", "processing")) == (2, 0)
    assert _claim(conn, "e") == ids[3:]
    complete(conn, ids)
    assert archived(conn) == 5 and _depth(conn, "e") == 0


@pytest.mark.parametrize("protocol, config, paused, priority", [
    ("pull", '{"delay_seconds": 30}', False, None), ("noop", '{"delay_seconds": 30}', False, None),
    ("noop", '{"max_depth": 50}', False, None), ("noop", "{}", True, None), ("noop", "{}", False, 2)])
def test_what_a_stage_cannot_honour_in_a_batch_goes_to_the_queue(conn, protocol, config, paused, priority):
    conn.execute("SELECT courier.create_endpoint('e', %s, %s::jsonb)", (protocol, config))
    if paused:
        conn.execute("SELECT courier.pause_endpoint('e')")
    _stage_alive(conn)
    ids = _send_batch(conn, "e", 4, priority)
    assert _staged(conn) == [] and {message_status(conn, m) for m in ids} == {"pending"} and _depth(conn, "e") == 4


def test_a_batch_the_estimate_has_no_room_for_takes_the_exact_path(conn):
    """A batch stages only while the leader's estimate, which counts the stage, leaves the queue
    at most half full with the whole batch in it; past that max_queue_size is applied exactly to
    the queue's counters, which count a staged message once it is moved, as for single sends."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    conn.execute("SELECT courier.set_setting('max_queue_size', '10')")
    _stage_alive(conn)
    staged = _send_batch(conn, "e", 5)
    assert _staged(conn) == staged
    conn.execute("SELECT courier.estimate_active_messages()")  # which counts the five staged messages
    direct = _send_batch(conn, "e", 3)
    assert _staged(conn) == staged and {message_status(conn, m) for m in direct} == {"pending"}
    with pytest.raises(psycopg.Error, match="max_queue_size"):
        _send_batch(conn, "e", 8)
    conn.execute("SELECT courier.keep_send_stage()")  # moved: counted
    with pytest.raises(psycopg.Error, match="max_queue_size"):
        _send_batch(conn, "e", 3)
    assert _depth(conn, "e") == 8


def test_batches_go_to_the_queue_while_no_claim_takes_the_stage(conn):
    """A staged message no claim takes is written twice (staged, then moved): while the stage's
    oldest message has waited 100 ms or more, batches go to the queue; single sends still stage."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    _stage_alive(conn)
    waiting = _send_batch(conn, "e", 3)
    conn.execute("UPDATE courier.send_stage SET created_at = now() - interval '150 milliseconds' WHERE id = %s",
                 (waiting[0],))
    direct = _send_batch(conn, "e", 2)
    assert _staged(conn) == waiting and {message_status(conn, m) for m in direct} == {"pending"}
    single = scalar(conn, "SELECT courier.send('e', '{}')")
    assert _staged(conn) == [*waiting, single]
    assert _claim(conn, "e", batch=10) == [*direct, *waiting, single]  # the queue's first, then the stage
    again = _send_batch(conn, "e", 2)
    assert _staged(conn) == again


def test_verbs_that_find_messages_see_messages_staged_in_a_batch(conn):
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    _stage_alive(conn)
    first, cancelled, deleted, *rest = _send_batch(conn, "e", 6)
    assert conn.execute("SELECT was FROM courier.cancel_message(%s)", (cancelled,)).fetchone()[0] == "pending"
    assert message_status(conn, cancelled) == "cancelled"
    again = _send_batch(conn, "e", 2)
    conn.execute("SELECT * FROM courier.delete_message(%s)", (deleted,))
    assert message_status(conn, deleted) is None
    assert scalar(conn, "SELECT courier.purge_queue_count('e')") == 6
    assert scalar(conn, "SELECT courier.purge_queue('e')") == 6
    assert {message_status(conn, m) for m in [first, *rest, *again]} == {"purged"}
    assert _staged(conn) == [] and _depth(conn, "e") == 0


def test_a_worker_delivers_every_message_of_staged_batches(dsn, conn):
    """A real `courier worker` and producers sending batches of 100 and single sends together:
    every message is delivered once, and the stage and counters end empty."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    worker = start_worker_process(dsn)
    try:
        wait_for(lambda: scalar(conn, "SELECT stage_until > now() AND room_until > now() FROM courier.send_limits"))
        sent = []
        for _ in range(5):
            sent += [*_send_batch(conn, "e", 100), scalar(conn, "SELECT courier.send('e', '{}')")]
        assert len(set(sent)) == 505
        wait_for(lambda: archived(conn) == 505, timeout=30)
    finally:
        worker.terminate()
        worker.wait(30)
    assert _staged(conn) == [] and _depth(conn, "e") == 0
    assert scalar(conn, "SELECT count(DISTINCT id) FROM courier.archive WHERE id = ANY (%s)", (sent,)) == 505


@pytest.mark.parametrize("entry", ["report_outcomes", "report_and_claim"])
def test_a_report_of_claims_from_the_stage_and_the_queue_counts_each_endpoint_once(conn, entry):
    """A worker's report of successes, some claimed where they were staged and some in the queue,
    for two endpoints: each delivery is archived and counted once for its endpoint, each
    endpoint's row changes as a success changes it, and a report whose lease went stale is
    counted stale and leaves its message alone. report_and_claim takes this path without calling
    report_outcomes, and answers the same."""
    for name in ("e1", "e2"):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    queued = [scalar(conn, "SELECT courier.send('e1', '{}')") for _ in range(2)]  # no mover yet: the queue
    _stage_alive(conn)
    staged = [scalar(conn, "SELECT courier.send(%s, '{}')", (name,)) for name in ("e1", "e2")]
    assert _staged(conn) == staged
    claims = {}
    for name in ("e1", "e2"):
        claims.update(conn.execute("SELECT c.id, c.lease FROM courier.claim_batch('w', 10, "
                                   "(SELECT id FROM courier.endpoints WHERE name = %s)) c", (name,)).fetchall())
    assert sorted(claims) == sorted(queued + staged) and _taken_in_stage(conn) == staged
    # e2 closed with failures counted, and never a success; e1's last success a minute ago.
    conn.execute("UPDATE courier.endpoints SET circuit_failure_count = 2 WHERE name = 'e2'")
    conn.execute("UPDATE courier.endpoints SET last_success_at = now() - interval '1 minute' WHERE name = 'e1'")
    stale_id = queued[1]
    ids = [queued[0], staged[0], staged[1], stale_id]
    leases = [claims[i] for i in ids[:3]] + [claims[stale_id] + 1]
    outcomes, errors = ["success"] * 4, [None] * 4
    if entry == "report_outcomes":
        counts = conn.execute("SELECT delivered, retried, dead_lettered, stale "
                              "FROM courier.report_outcomes(%s, %s, %s, %s)",
                              (ids, leases, outcomes, errors)).fetchone()
    else:
        counts = conn.execute(
            "SELECT delivered, retried, dead_lettered, stale FROM courier.report_and_claim('w', 1, "
            "(SELECT id FROM courier.endpoints WHERE name = 'e1'), %s, %s, %s, %s)",
            (ids, leases, outcomes, errors)).fetchone()
    assert counts == (3, 0, 0, 1)
    assert [message_status(conn, i) for i in ids] == ["completed"] * 3 + ["processing"]
    assert _taken_in_stage(conn) == []
    delivered = dict(conn.execute(
        "SELECT e.name, sum(t.total)::integer FROM courier.delivery_totals t JOIN courier.endpoints e "
        "ON e.id = t.endpoint_id WHERE t.outcome = 'delivered' GROUP BY e.name").fetchall())
    assert delivered == {"e1": 2, "e2": 1}
    assert scalar(conn, "SELECT sum(total)::integer FROM courier.delivery_totals WHERE outcome = 'stale_report'") == 1
    rows = {name: rest for name, *rest in conn.execute(
        "SELECT name, circuit_failure_count, last_success_at > now() - interval '1 second' FROM courier.endpoints")}
    assert rows == {"e1": [0, True], "e2": [0, True]}


def test_a_report_with_failures_moves_only_the_failures_from_the_stage(conn):
    """A report of claims taken in the stage, some delivered and some not: the delivered ones go
    from the stage to the archive, as an all-success report's do, and only the failures are
    written into the queue, where their retries and history are kept. The endpoint is settled
    once for both: a success resets its circuit's count and the failures of the same report
    count from zero."""
    conn.execute("SELECT courier.create_endpoint('e', 'noop', '{}')")
    _stage_alive(conn)
    sent = [scalar(conn, "SELECT courier.send('e', '{}')") for _ in range(6)]
    conn.execute("UPDATE courier.endpoints SET circuit_failure_count = 3 WHERE name = 'e'")
    with conn.transaction():
        claimed = conn.execute("SELECT c.id, c.lease FROM courier.claim_batch('w', 10, "
                               "(SELECT id FROM courier.endpoints WHERE name = 'e')) c").fetchall()
        assert [i for i, _ in claimed] == sent and _taken_in_stage(conn) == sent
        outcomes = ["success", "retryable", "success", "permanent", "success", "snooze"]
        writes_before = _queue_writes(conn)
        counts = conn.execute("SELECT delivered, retried, dead_lettered, stale FROM courier.report_outcomes("
                              "%s, %s, %s, %s, %s)", ([i for i, _ in claimed], [lease for _, lease in claimed],
                                                      outcomes, [None, "HTTP 503", None, "HTTP 410", None, None],
                                                      [None, None, None, None, None, 30])).fetchone()
        inserted = _queue_writes(conn)[0] - writes_before[0]
    assert counts == (3, 2, 1, 0)
    assert inserted == 3  # the three failures, moved into the queue; no success passes through it
    assert [message_status(conn, i) for i in sent] == ["completed", "pending", "completed", "failed", "completed",
                                                        "pending"]
    assert conn.execute("SELECT retry_count, last_error FROM courier.queue WHERE id = %s", (sent[1],)).fetchone() == \
        (1, "HTTP 503")
    assert conn.execute("SELECT retry_count FROM courier.queue WHERE id = %s", (sent[5],)).fetchone() == (0,)
    assert _taken_in_stage(conn) == [] and _staged(conn) == []
    totals = dict(conn.execute("SELECT outcome, sum(total)::integer FROM courier.delivery_totals "
                               "WHERE outcome IN ('delivered', 'failed_attempt') GROUP BY outcome").fetchall())
    assert totals == {"delivered": 3, "failed_attempt": 2}
    assert conn.execute("SELECT circuit_state, circuit_failure_count, last_error, last_success_at IS NOT NULL, "
                        "last_failure_at IS NOT NULL FROM courier.endpoints WHERE name = 'e'").fetchone() == \
        ("closed", 1, "HTTP 410", True, True)
    assert (_depth_of(conn, "e", "pending"), _depth_of(conn, "e", "processing")) == (2, 0)
