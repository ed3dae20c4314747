"""The depth counters are unlogged (migration 0038): a crash empties them, and one count of the
queue makes them whole again, exactly, even while producers keep sending."""

from __future__ import annotations

import threading

import psycopg
import pytest

from sqlkit import migrate, queries
from tests.test_soak import EmbeddedServer

# The counts as readers see them: the counters hold leased pull messages as pending, and
# courier._depth_by_endpoint() shows them apart (courier._counted_status).
COUNTED = """
SELECT coalesce(jsonb_object_agg(endpoint_id || '/' || status, messages), '{}')
FROM courier._depth_by_endpoint() d WHERE messages <> 0
"""
ACTUAL = """
SELECT coalesce(jsonb_object_agg(endpoint_id || '/' || status, messages), '{}')
FROM (SELECT endpoint_id, status, count(*) AS messages FROM courier.queue GROUP BY endpoint_id, status) q
"""


def _fill(conn: psycopg.Connection) -> None:
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    conn.execute("SELECT courier.send_batch('hook', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, 40) g")
    conn.execute("SELECT courier.send_batch('jobs', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, 30) g")
    conn.execute("SELECT count(*) FROM courier.dequeue('jobs', 7, 60)")


def test_a_crash_empties_the_counters_and_the_next_migrate_counts_the_queue_again():
    server = EmbeddedServer()
    try:
        migrate.migrate(server.dsn)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            _fill(conn)
            before = conn.execute(COUNTED).fetchone()[0]
            assert before == conn.execute(ACTUAL).fetchone()[0]
            assert before  # pending and processing rows of two endpoints
        server.crash_restart()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            # The premise: crash recovery resets unlogged tables, the mark of a whole count included.
            assert conn.execute("SELECT count(*) FROM courier.queue_depth").fetchone()[0] == 0
            assert conn.execute("SELECT count(*) FROM courier.queue_depth_built").fetchone()[0] == 0
            migrate.migrate(server.dsn)  # what every worker, console and `courier migrate` runs at start
            assert conn.execute(COUNTED).fetchone()[0] == before
            assert conn.execute("SELECT courier.rebuild_queue_depth()").fetchone()[0] == 0  # whole: nothing to do
            event = conn.execute("SELECT details FROM courier.event_log WHERE event_type = 'queue_depth.rebuilt'"
                                 ).fetchone()
            assert event is not None
            # Sends and claims after the rebuild are counted on top of it.
            conn.execute("SELECT courier.send('hook', '{}')")
            conn.execute("SELECT count(*) FROM courier.dequeue('jobs', 3, 60)")
            assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
    finally:
        server.close()


def test_a_rebuild_during_concurrent_sends_leaves_the_counters_exact(dsn: str):
    with psycopg.connect(dsn, autocommit=True) as conn:
        _fill(conn)
        stop = threading.Event()
        errors: list[BaseException] = []

        def produce(target: str) -> None:
            try:
                with psycopg.connect(dsn, autocommit=True) as producer:
                    while not stop.is_set():
                        producer.execute("SELECT courier.send(%s, '{}')", (target,))
            except BaseException as error:  # reported by the assertion below
                errors.append(error)

        producers = [threading.Thread(target=produce, args=(t,)) for t in ("hook", "jobs", "hook")]
        for producer in producers:
            producer.start()
        try:
            for _ in range(5):
                # As after a crash: the counters and their mark gone, producers still sending.
                with conn.transaction():
                    conn.execute("DELETE FROM courier.queue_depth")
                    conn.execute("DELETE FROM courier.queue_depth_built")
                assert conn.execute("SELECT courier.rebuild_queue_depth()").fetchone()[0] > 0
        finally:
            stop.set()
            for producer in producers:
                producer.join(30)
        assert not errors
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
        assert conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] > 70


def _send_buffers(conn: psycopg.Connection, send: str) -> int:
    plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT {send}").fetchone()[0]
    top = plan[0]["Plan"]
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


@pytest.mark.parametrize("protocol, send", [
    ("noop", "courier.send('hook', '{}')"),
    ("pull", "courier.enqueue('hook', '{}')"),
    ("noop", "courier.send_with_options('hook', '{}', p_priority => 2)"),
])
def test_each_send_of_a_long_transaction_costs_what_the_first_ones_did(conn: psycopg.Connection, protocol, send):
    """The counter versions a transaction leaves cannot be pruned before it ends: when every send
    updated one row, each walked all the earlier ones, and 20,000 sends in one transaction took
    9.5 s (pgmq's took 0.1 s). Each single send moves to a new counter row after at most 64
    (its INSERT's command id picks the row: _count_sent_in_slot)."""
    conn.execute("SELECT courier.create_endpoint('hook', %s, '{}')", (protocol,))
    with conn.transaction():
        conn.execute("SELECT courier.estimate_active_messages()")  # as the maintenance leader does
        for _ in range(10):
            early = _send_buffers(conn, send)
        conn.execute(f"SELECT count({send}) FROM generate_series(1, 3000)")
        conn.execute("SELECT courier.estimate_active_messages()")
        # The least of three: one of them may be the send that starts a new page of the queue.
        late = min(_send_buffers(conn, send) for _ in range(3))
        most = conn.execute("SELECT max(messages) FROM courier.queue_depth WHERE backend_pid = pg_backend_pid() "
                            "AND status = 'pending'").fetchone()[0]
        assert most <= 64, most
        assert late <= early + 3, (early, late)
    assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
    assert conn.execute("SELECT courier.compact_queue_depth()").fetchone()[0] >= 0
    rows = conn.execute("SELECT count(*) FROM courier.queue_depth WHERE slot <> 0").fetchone()[0]
    assert rows == 0  # the extra slots are folded back
    assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]


def _queue_limit(conn: psycopg.Connection, limit: int) -> None:
    conn.execute("SELECT courier.set_setting('max_queue_size', %s)", (str(limit),))


def _estimate(conn: psycopg.Connection, active: int, age_seconds: float) -> None:
    conn.execute("UPDATE courier.send_limits SET active_estimate = %s, "
                 "estimated_at = clock_timestamp() - make_interval(secs => %s)", (active, age_seconds))


def test_backpressure_counts_exactly_past_half_the_limit_whatever_the_estimate_says(conn: psycopg.Connection):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    _queue_limit(conn, 10)
    conn.execute("SELECT courier.send_batch('hook', array_fill('{}'::jsonb, ARRAY[6]))")
    _estimate(conn, 0, 0)  # fresh, but 0 + 1 would pass only while at most half of 10
    assert conn.execute("SELECT courier.send('hook', '{}')").fetchone()[0]  # 7: exact count says room
    _estimate(conn, 1, 0)
    conn.execute("SELECT courier.send_batch('hook', array_fill('{}'::jsonb, ARRAY[3]))")  # 10
    _estimate(conn, 5, 0)  # 5 + 1 > 10 / 2: counted exactly, and refused
    with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
        conn.execute("SELECT courier.send('hook', '{}')")


def test_an_estimate_older_than_two_seconds_is_not_trusted(conn: psycopg.Connection):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    _queue_limit(conn, 10)
    conn.execute("SELECT courier.send_batch('hook', array_fill('{}'::jsonb, ARRAY[10]))")
    _estimate(conn, 0, 5)  # says empty, but the leader wrote it 5 s ago
    with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
        conn.execute("SELECT courier.send('hook', '{}')")
    _estimate(conn, 0, 0)  # fresh and far below: trusted (what the leader writes each second)
    assert conn.execute("SELECT courier.send('hook', '{}')").fetchone()[0]
    assert conn.execute("SELECT courier.estimate_active_messages()").fetchone()[0] == 0
    assert conn.execute("SELECT active_estimate FROM courier.send_limits").fetchone()[0] == 11



def test_every_shape_of_write_keeps_the_counters_exact(conn: psycopg.Connection):
    """The counting triggers take a short path when a statement's rows share one endpoint and
    one status (migration 0043) and the grouped one otherwise: both must count what is there."""
    conn.execute("SELECT courier.create_endpoint('other', 'noop', '{}')")
    _fill(conn)
    steps = [
        "SELECT courier.send('hook', '{}')",                                   # one row, one group
        "SELECT courier.send_with_options('hook', '{}', p_priority => 7)",     # a new priority level
        "INSERT INTO courier.queue (endpoint_id, payload, status) "            # two endpoints, two statuses
        "SELECT e.id, '{}', s FROM courier.endpoints e, unnest(ARRAY['pending', 'processing']) s "
        "WHERE e.name IN ('hook', 'other')",
        "UPDATE courier.queue SET status = 'processing' WHERE id IN (SELECT id FROM courier.queue "  # two endpoints
        "WHERE status = 'pending' AND visible_at IS NULL ORDER BY id DESC LIMIT 3)",
        "UPDATE courier.queue SET status = CASE status WHEN 'pending' THEN 'processing' ELSE 'pending' END "
        "WHERE visible_at IS NULL",                                            # a swap: statuses cross
        "UPDATE courier.queue SET updated_at = now() WHERE status = 'pending'",  # no status moves
        "UPDATE courier.queue SET status = 'processing' WHERE false",          # no rows at all
        "SELECT count(*) FROM courier.dequeue('jobs', 5, 60)",                # one endpoint, one move
        "SELECT count(*) FROM courier.claim_batch('w', 4, (SELECT id FROM courier.endpoints "
        "WHERE name = 'hook'))",                                              # a push claim counts itself
        "SELECT count(*) FROM courier._claim_due('w', 6)",                     # of any endpoint: two of them
        "SELECT count(*) FROM courier.ack(ARRAY(SELECT id FROM courier.queue WHERE status = 'processing' "
        "AND visible_at IS NOT NULL ORDER BY id), ARRAY(SELECT lease FROM courier.queue WHERE status = 'processing' "
        "AND visible_at IS NOT NULL ORDER BY id))",
        "DELETE FROM courier.queue WHERE id IN (SELECT id FROM courier.queue ORDER BY id LIMIT 5)",
        "DELETE FROM courier.queue WHERE endpoint_id = (SELECT id FROM courier.endpoints WHERE name = 'other')",
    ]
    for step in steps:
        conn.execute(step)
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0], step


def test_single_sends_count_their_own_message_on_every_path(conn: psycopg.Connection):
    """A single send (send, send_with_options, enqueue) counts its message itself and makes the
    insert trigger stand aside for that statement only: a duplicate, a replacement in place, a
    refused send, a rolled-back one and a batch in the same transaction must all count right."""
    _fill(conn)
    conn.execute("SELECT courier.create_endpoint('off', 'noop', '{}')")
    conn.execute("SELECT courier.disable_endpoint('off')")
    steps = [
        "SELECT courier.send('hook', '{}')",
        "SELECT courier.send('jobs', '{}')",                                    # a pull topic through send
        "SELECT courier.send_with_options('hook', '{}', p_priority => 9)",
        "SELECT courier.send_with_options('hook', '{\"a\": 1}', p_idempotency_key => 'k')",
        "SELECT courier.send_with_options('hook', '{\"a\": 1}', p_idempotency_key => 'k')",  # the duplicate
        "SELECT courier.enqueue('jobs', '{}')",
        "SELECT courier.enqueue('jobs', '{\"v\": 1}', p_key => 'x')",
        "SELECT courier.enqueue('jobs', '{\"v\": 2}', p_key => 'x')",          # replaced in place
        "SELECT courier.send('hook', '{}'), courier.send_batch('hook', ARRAY['{}', '{}']::jsonb[]), "
        "courier.send('jobs', '{}')",                                           # single and batch together
    ]
    for step in steps:
        conn.execute(step)
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0], step
    with pytest.raises(psycopg.Error):
        conn.execute("SELECT courier.send('off', '{}')")                       # refused: nothing counted
    with conn.transaction(force_rollback=True):
        conn.execute("SELECT courier.send('hook', '{}')")
        conn.execute("SELECT courier.enqueue('jobs', '{}')")
    # After them, in the same session, a batch and a plain insert are counted by the trigger again.
    conn.execute("SELECT courier.send_batch('jobs', ARRAY['{}', '{}', '{}']::jsonb[])")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload) SELECT id, '{}' FROM courier.endpoints "
                 "WHERE name = 'hook'")
    assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]


def test_a_dequeue_counts_nothing_and_the_trigger_counts_every_other_update(conn: psycopg.Connection):
    """A lease leaves the counters alone (a leased pull message is counted as pending) and dequeue
    makes the update trigger stand aside for that statement only: lapsed leases taken again
    beside pending ones, a dequeue many times in one transaction, and plain updates after it in
    the same transaction must all read right."""
    _fill(conn)  # 30 jobs, 7 of them leased
    lapse = ("UPDATE courier.queue SET visible_at = now() - interval '1 second' "
             "WHERE status = 'processing' AND visible_at IS NOT NULL")
    steps = [
        lapse,
        "SELECT count(*) FROM courier.dequeue('jobs', 10, 60)",  # the 7 lapsed first, then 3 pending
        "SELECT count(*) FROM courier.dequeue('jobs', 100, 60)",  # the rest, all pending
        "SELECT count(*) FROM courier.dequeue('jobs', 5, 60)",   # nothing left: no counter written
        lapse,
        "SELECT count(*) FROM courier.dequeue('jobs', 4, 60)",   # lapsed only: no status moves
    ]
    for step in steps:
        conn.execute(step)
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0], step
    conn.execute("SELECT courier.send_batch('jobs', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, 200) g")
    with conn.transaction():
        for _ in range(70):  # past 64 writes: the transaction's counter slot moves on
            conn.execute("SELECT count(*) FROM courier.dequeue('jobs', 2, 60)")
        conn.execute("UPDATE courier.queue SET status = 'pending', visible_at = now() "
                     "WHERE id IN (SELECT id FROM courier.queue WHERE status = 'processing' "
                     "AND visible_at IS NOT NULL ORDER BY id LIMIT 3)")  # counted by the trigger again
        conn.execute("SELECT count(*) FROM courier.release(ARRAY(SELECT id FROM courier.queue "
                     "WHERE status = 'processing' AND visible_at IS NOT NULL ORDER BY id LIMIT 2), "
                     "ARRAY(SELECT lease FROM courier.queue WHERE status = 'processing' AND visible_at IS NOT NULL "
                     "ORDER BY id LIMIT 2))")
    assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
    with conn.transaction(force_rollback=True):
        conn.execute("SELECT count(*) FROM courier.dequeue('jobs', 20, 60)")
    assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]


def test_ack_and_receive_count_their_deletes_and_the_trigger_counts_the_next(conn: psycopg.Connection):
    """The pull ack and receive count the messages they delete in their own statements and make
    the delete trigger stand aside for those statements only: a plain DELETE after them in the
    same transaction is counted again, and so is a staged send's claim (which counts itself too) with a plain
    INSERT after it, and a push report beside them."""
    _fill(conn)  # 40 hook messages, 30 jobs, 7 of them leased
    conn.execute("SELECT courier.keep_send_stage()")
    conn.execute("SELECT courier.estimate_active_messages()")
    conn.execute("SELECT courier.send('hook', '{}')")  # staged
    hook = "(SELECT id FROM courier.endpoints WHERE name = 'hook')"
    with conn.transaction():
        claimed = conn.execute(f"SELECT c.id, c.lease FROM courier.claim_batch('w', 50, {hook}) c").fetchall()
        assert len(claimed) == 41  # the queue's 40, then the staged one
        conn.execute(f"INSERT INTO courier.queue (endpoint_id, payload) SELECT {hook}, '{{}}'")
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
        conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, %s, %s)",
                     ([i for i, _ in claimed[:30]], [lease for _, lease in claimed[:30]], ["success"] * 30,
                      [None] * 30))
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
        leased = conn.execute("SELECT id, lease FROM courier.queue WHERE status = 'processing' "
                              "AND visible_at IS NOT NULL ORDER BY id").fetchall()
        conn.execute("SELECT count(*) FROM courier.ack(%s, %s)",
                     ([i for i, _ in leased], [lease for _, lease in leased]))
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
        assert len(conn.execute("SELECT * FROM courier.receive('jobs', 5)").fetchall()) == 5
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
        conn.execute("DELETE FROM courier.queue WHERE id IN (SELECT id FROM courier.queue ORDER BY id DESC LIMIT 4)")
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
    assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]


def _counter_rows(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT ctid::text, xmin::text, endpoint_id, status, messages FROM courier.queue_depth "
                        "ORDER BY 1").fetchall()


def test_a_lease_writes_no_counter_and_every_reader_shows_the_leased_apart(conn: psycopg.Connection):
    """A leased pull message is counted as pending (courier._counted_status), so dequeue, nack and
    release write no counter row; topics(), the metrics, endpoint health and purge's count show
    the leased ones apart, as before."""
    _fill(conn)  # 30 jobs, 7 of them leased; 40 hook messages
    before = _counter_rows(conn)
    conn.execute("SELECT count(*) FROM courier.dequeue('jobs', 5, 60)")
    leased = conn.execute("SELECT id, lease FROM courier.queue WHERE status = 'processing' "
                          "AND visible_at IS NOT NULL ORDER BY id LIMIT 3").fetchall()
    conn.execute("SELECT count(*) FROM courier.nack(%s, %s, 'no', 0)",
                 ([leased[0][0]], [leased[0][1]]))
    conn.execute("SELECT count(*) FROM courier.release(%s, %s)",
                 ([r[0] for r in leased[1:]], [r[1] for r in leased[1:]]))
    assert _counter_rows(conn) == before  # not a row version more
    # 30 jobs: 7 + 5 leased, 3 of them given back
    assert conn.execute("SELECT pending, leased FROM courier.topics() WHERE topic = 'jobs'").fetchone() == (21, 9)
    metrics = dict(conn.execute("SELECT labels->>'status', metric_value::int FROM courier.metrics() "
                                "WHERE metric_name = 'queue_depth_by_endpoint' AND labels->>'endpoint' = 'jobs' "
                                "AND labels->>'status' IN ('pending', 'processing')").fetchall())
    assert metrics == {"pending": 21, "processing": 9}
    assert conn.execute("SELECT pending_messages FROM courier.get_endpoint_health('jobs')").fetchone()[0] == 21
    assert conn.execute("SELECT courier.purge_queue_count('jobs')").fetchone()[0] == 21
    listed = queries.fetch_one(conn, "list_endpoints", {"name": "jobs"})  # `courier endpoint list`
    assert (listed["pending_messages"], listed["processing_messages"]) == (21, 9)
    assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
    conn.execute("SELECT count(*) FROM courier.ack(ARRAY(SELECT id FROM courier.queue WHERE status = 'processing' "
                 "AND visible_at IS NOT NULL ORDER BY id), ARRAY(SELECT lease FROM courier.queue "
                 "WHERE status = 'processing' AND visible_at IS NOT NULL ORDER BY id))")
    assert conn.execute("SELECT pending, leased FROM courier.topics() WHERE topic = 'jobs'").fetchone() == (21, 0)
    assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]


def test_the_upgrade_folds_leased_counts_of_messages_in_flight(empty_dsn: str):
    """Migration 0052 moves what the counters held as processing for pull topics into pending,
    with messages leased at the time: afterwards every reader reads what is there, and acking
    them counts right."""
    migrate.migrate(empty_dsn, target=51)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        # Version 51 has no functions: rows and counters as its triggers would have kept them.
        conn.execute("INSERT INTO courier.endpoints (name, protocol) VALUES ('jobs', 'pull'), ('hook', 'noop')")
        conn.execute("INSERT INTO courier.queue (endpoint_id, payload, status, visible_at, lease) "
                     "SELECT e.id, '{}', s, now() + CASE s WHEN 'processing' THEN interval '1 hour' ELSE '0' END, 1 "
                     "FROM courier.endpoints e, unnest(ARRAY['pending', 'pending', 'processing', 'processing', "
                     "'processing']) s WHERE e.name = 'jobs'")
        conn.execute("INSERT INTO courier.queue (endpoint_id, payload, status) SELECT e.id, '{}', s "
                     "FROM courier.endpoints e, unnest(ARRAY['pending', 'processing']) s WHERE e.name = 'hook'")
        conn.execute("INSERT INTO courier.queue_depth (endpoint_id, status, backend_pid, slot, messages) "
                     "SELECT endpoint_id, status, b, 0, count(*) FROM courier.queue, generate_series(0, 1) b "
                     "GROUP BY endpoint_id, status, b")  # two backends' rows, each holding the count
        conn.execute("UPDATE courier.queue_depth SET messages = CASE backend_pid WHEN 0 THEN messages + 1 ELSE -1 END")
        assert conn.execute("SELECT count(*) FROM courier.queue_depth_built").fetchone()[0] == 1  # no rebuild
    migrate.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
        assert conn.execute("SELECT count(*) FROM courier.queue_depth d JOIN courier.endpoints e "
                            "ON e.id = d.endpoint_id WHERE e.name = 'jobs' AND d.status = 'processing'"
                            ).fetchone()[0] == 0
        assert conn.execute("SELECT pending, leased FROM courier.topics() WHERE topic = 'jobs'").fetchone() == (2, 3)
        conn.execute("SELECT count(*) FROM courier.ack(ARRAY(SELECT id FROM courier.queue WHERE status = 'processing' "
                     "AND visible_at IS NOT NULL), ARRAY(SELECT lease FROM courier.queue WHERE status = 'processing' "
                     "AND visible_at IS NOT NULL))")
        assert conn.execute(COUNTED).fetchone()[0] == conn.execute(ACTUAL).fetchone()[0]
        assert conn.execute("SELECT pending, leased FROM courier.topics() WHERE topic = 'jobs'").fetchone() == (2, 0)
