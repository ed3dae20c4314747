"""The archive (ulak-reliability): monthly partitions, moves out of the default partition,
retention, a hot table that holds only active messages, and replays."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import psycopg
import pytest

from sqlkit.errors import InvalidInput, NotFound
from tests.helpers import archived, report, scalar
from tests.workers import run_pool_until

FAR_PAST = datetime(2000, 1, 1, tzinfo=UTC)
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def month_name(months_from_now: int) -> str:
    now = datetime.now(UTC)
    index = now.year * 12 + now.month - 1 + months_from_now
    return f"archive_{index // 12:04d}_{index % 12 + 1:02d}"


def mid_month(months_from_now: int) -> datetime:
    name = month_name(months_from_now)
    return datetime(int(name[8:12]), int(name[13:15]), 15, tzinfo=UTC)


def partitions(conn) -> list[str]:
    return [name for (name,) in conn.execute("SELECT partition_name FROM courier.archive_partitions()")]


def partition_of(conn, archive_id: int) -> str:
    return scalar(conn, "SELECT tableoid::regclass::text FROM courier.archive WHERE id = %s", (archive_id,))


def archive_row(conn, archive_id: int, created_at: datetime, status: str = "completed", endpoint: int = 1) -> None:
    conn.execute("INSERT INTO courier.archive (id, endpoint_id, payload, status, completed_at, created_at) "
                 "VALUES (%s, %s, %s, %s, now(), %s)", (archive_id, endpoint, f'{{"n": {archive_id}}}', status,
                                                        created_at))


@pytest.fixture
def hook(conn) -> int:
    return scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")


def deliver(conn, endpoint: int, ids: list[int], outcome: str) -> None:
    conn.execute("SELECT courier.claim_batch('w', %s, %s)", (len(ids), endpoint))
    report(conn, ids, [outcome] * len(ids), [None if outcome == "success" else "[PERMANENT] 400"] * len(ids))


@pytest.fixture
def history(conn, hook) -> dict[str, list[int]]:
    """Archived messages of every status on 'hook': 4 completed, 3 failed, 2 expired."""
    send = "SELECT courier.send_batch('hook', ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, %s) g))"
    completed = scalar(conn, send, (4,))
    deliver(conn, hook, completed, "success")
    failed = scalar(conn, send, (3,))
    deliver(conn, hook, failed, "permanent")
    expired = [scalar(conn, "SELECT courier.send_with_options('hook', %s::jsonb, p_idempotency_key := %s, "
                            "p_expires_at := now() + interval '1 millisecond')", (f'{{"e": {n}}}', f"key-{n}"))
               for n in range(2)]
    conn.execute("SELECT pg_sleep(0.01)")
    assert scalar(conn, "SELECT courier.mark_expired_messages()") == 2
    assert scalar(conn, "SELECT courier.archive_completed_messages(0, 100)") == 2
    return {"completed": completed, "failed": failed, "expired": expired}


# Partitions ---------------------------------------------------------------------------------

def test_a_fresh_install_has_this_month_three_ahead_and_a_default(conn):
    assert partitions(conn) == [month_name(n) for n in range(4)] + ["archive_default"]
    indexes = {name: definition for name, definition in conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'courier' AND tablename = 'archive'")}
    assert "USING brin (created_at) WITH (pages_per_range='64', autosummarize='on')" in \
        indexes["archive_created_brin"]


def test_partitions_are_created_for_the_months_ahead_once(conn):
    assert scalar(conn, "SELECT courier.maintain_archive_partitions(6)") == 3
    assert scalar(conn, "SELECT courier.maintain_archive_partitions(6)") == 0
    assert partitions(conn) == [month_name(n) for n in range(7)] + ["archive_default"]
    archive_row(conn, 1, mid_month(5))
    assert partition_of(conn, 1) == f"courier.{month_name(5)}"


def test_rows_in_the_default_partition_move_into_their_month_once_it_exists(conn):
    archive_row(conn, 1, datetime(2024, 2, 3, tzinfo=UTC))
    archive_row(conn, 2, datetime(2024, 2, 28, 23, 59, tzinfo=UTC))
    archive_row(conn, 3, mid_month(8))
    assert {partition_of(conn, i) for i in (1, 2, 3)} == {"courier.archive_default"}
    health = dict(conn.execute("SELECT check_name, status FROM courier.health_check()").fetchall())
    assert health["archive_partitions"] == "warning"

    assert scalar(conn, "SELECT courier.maintain_archive_partitions(3)") == 2
    assert partition_of(conn, 1) == partition_of(conn, 2) == "courier.archive_2024_02"
    assert partition_of(conn, 3) == f"courier.{month_name(8)}"
    assert scalar(conn, "SELECT count(*) FROM courier.archive_default") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.archive") == 3
    health = dict(conn.execute("SELECT check_name, status FROM courier.health_check()").fetchall())
    assert health["archive_partitions"] == "ok"


def test_cleanup_drops_partitions_older_than_the_retention(conn):
    for archive_id, months_ago in ((1, 30), (2, 7), (3, 6), (4, 2)):
        archive_row(conn, archive_id, mid_month(-months_ago))
    conn.execute("SELECT courier.maintain_archive_partitions(3)")
    conn.execute("SELECT courier.set_setting('archive_retention_months', '6')")

    assert scalar(conn, "SELECT courier.cleanup_old_archive_partitions()") == 2
    remaining = partitions(conn)
    assert month_name(-30) not in remaining and month_name(-7) not in remaining
    assert {month_name(-6), month_name(-2), month_name(0)} <= set(remaining)
    assert sorted(i for (i,) in conn.execute("SELECT id FROM courier.archive")) == [3, 4]
    # An explicit argument overrides the setting.
    assert scalar(conn, "SELECT courier.cleanup_old_archive_partitions(3)") == 1
    assert sorted(i for (i,) in conn.execute("SELECT id FROM courier.archive")) == [4]
    dropped = scalar(conn, "SELECT count(*) FROM courier.event_log WHERE event_type = 'archive.partitions_dropped'")
    assert dropped == 2


def test_retention_forgets_the_replay_markers_of_messages_it_dropped(conn):
    """Replay markers (replay once unless --again) would otherwise grow with every replay for
    good; a message replayed before the retention cutoff was archived before it, so its row
    is gone once its partition is, and its marker goes with it."""
    for archive_id, months_ago in ((1, 8), (2, 2)):
        archive_row(conn, archive_id, mid_month(-months_ago))
    conn.execute("SELECT courier.maintain_archive_partitions(3)")
    assert scalar(conn, "SELECT courier.claim_replays(ARRAY[1, 2])") == [1, 2]
    conn.execute("UPDATE courier.replayed_messages SET replayed_at = %s WHERE archive_id = 1", (mid_month(-8),))
    assert scalar(conn, "SELECT courier.cleanup_old_archive_partitions(6)") == 1
    assert [i for (i,) in conn.execute("SELECT archive_id FROM courier.replayed_messages")] == [2]
    assert scalar(conn, "SELECT details ->> 'replay_markers_deleted' FROM courier.event_log "
                        "WHERE event_type = 'archive.partitions_dropped'") == "1"
    assert scalar(conn, "SELECT courier.claim_replays(ARRAY[2])") == []  # still replayed once


@pytest.mark.parametrize("call", ["SELECT courier.cleanup_old_archive_partitions(0)",
                                  "SELECT courier.cleanup_old_archive_partitions(121)",
                                  "SELECT courier.maintain_archive_partitions(-1)",
                                  "SELECT courier.archive_completed_messages(-5, 10)"])
def test_out_of_range_maintenance_arguments_are_refused(conn, call):
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute(call)


# The hot table ------------------------------------------------------------------------------

def test_after_100k_deliveries_the_queue_holds_only_active_messages(dsn, conn, hook):
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    for start in range(0, 100_000, 20_000):
        conn.execute("SELECT courier.send_batch('hook', ARRAY(SELECT jsonb_build_object('n', g) "
                     "FROM generate_series(%s::int, %s::int) g))", (start, start + 19_999))
    later = scalar(conn, "SELECT courier.send_with_options('hook', '{\"later\": true}', "
                         "p_scheduled_at := now() + interval '1 hour')")
    run_pool_until(dsn, lambda: archived(conn) >= 100_000, timeout=240, concurrency=256, batch_size=200)

    assert archived(conn) == 100_000
    assert conn.execute("SELECT id, status FROM courier.queue").fetchall() == [(later, "pending")]
    depth = dict(conn.execute("SELECT labels ->> 'status', metric_value FROM courier.metrics() "
                              "WHERE metric_name = 'queue_depth'").fetchall())
    assert depth == {"pending": 1, "processing": 0, "completed": 0, "failed": 0, "expired": 0}


def test_the_sweep_archives_finished_rows_older_than_asked(conn, hook):
    ids = scalar(conn, "SELECT courier.send_batch('hook', ARRAY['{}'::jsonb, '{}', '{}'])")
    # Rows completed in place (as the older primitives left them), for the sweep.
    conn.execute("UPDATE courier.queue SET status = 'completed', completed_at = now() WHERE id = ANY (%s)", (ids,))
    conn.execute("UPDATE courier.queue SET completed_at = now() - interval '2 hours' WHERE id = %s", (ids[0],))

    assert scalar(conn, "SELECT courier.archive_completed_messages()") == 1  # older than 1 hour by default
    assert scalar(conn, "SELECT courier.archive_completed_messages(0, 1)") == 1
    assert scalar(conn, "SELECT courier.archive_completed_messages(0, 1)") == 1
    assert scalar(conn, "SELECT courier.archive_completed_messages(0, 1)") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    assert archived(conn) == 3


def test_expiry_frees_the_idempotency_key_and_unblocks_the_ordering_key(conn, hook):
    stale = scalar(conn, "SELECT courier.send_with_options('hook', '{\"n\": 1}', p_ordering_key := 'k', "
                         "p_idempotency_key := 'once', p_expires_at := now() + interval '1 millisecond')")
    later = scalar(conn, "SELECT courier.send_with_options('hook', '{\"n\": 2}', p_ordering_key := 'k')")
    conn.execute("SELECT pg_sleep(0.01)")
    assert [row[0] for row in conn.execute("SELECT id FROM courier._claim_due('w', 10)")] == []

    assert scalar(conn, "SELECT courier.mark_expired_messages()") == 1
    assert [row[0] for row in conn.execute("SELECT id FROM courier._claim_due('w', 10)")] == [later]
    again = scalar(conn, "SELECT courier.send_with_options('hook', '{\"other\": true}', p_idempotency_key := 'once')")
    assert again not in (stale, later)
    counted = scalar(conn, "SELECT metric_value FROM courier.metrics() WHERE metric_name = 'messages_expired_total'")
    assert counted == 1


# Replay -------------------------------------------------------------------------------------

def replay_range(conn, endpoint: int, status: str | None = None, **options) -> int:
    return scalar(conn, "SELECT courier.replay_range(%s, %s, %s, %s, %s, %s, %s)",
                  (endpoint, FAR_PAST, FAR_FUTURE, status, options.get("batch_size"), options.get("dry_run", False),
                   options.get("again", False)))


def replayed_from(conn) -> list[int]:
    return [row[0] for row in conn.execute(
        "SELECT (metadata ->> 'replayed_from')::bigint FROM courier.queue "
        "WHERE metadata ? 'replayed_from' ORDER BY id")]


@pytest.mark.parametrize("status", ["completed", "failed", "expired", None])
def test_replay_range_by_status(conn, hook, history, status):
    expected = sorted(history[status] if status else [i for ids in history.values() for i in ids])
    assert replay_range(conn, hook, status, dry_run=True) == len(expected)
    assert replay_range(conn, hook, status) == len(expected)
    assert replayed_from(conn) == expected
    fresh = conn.execute("SELECT status, retry_count, idempotency_key, expires_at FROM courier.queue").fetchall()
    assert set(fresh) == {("pending", 0, None, None)}
    event = conn.execute("SELECT details FROM courier.event_log WHERE event_type = 'archive.replay_finished'"
                         ).fetchone()[0]
    assert event["replayed"] == len(expected)


def test_a_replay_of_every_status_leaves_cancelled_and_purged_messages_alone(conn, hook, history):
    """Cancelled and purged messages were taken out on purpose (issue 42): a blanket replay of
    the range does not send them after all; naming their status does."""
    cancelled = scalar(conn, "SELECT courier.send('hook', '{\"c\": 1}')")
    conn.execute("SELECT courier.cancel_message(%s)", (cancelled,))
    conn.execute("SELECT courier.send('hook', '{\"p\": 1}')")
    purged = scalar(conn, "SELECT max(id) FROM courier.queue")
    assert scalar(conn, "SELECT courier.purge_queue('hook')") == 1
    ended = sorted(i for ids in history.values() for i in ids)
    assert replay_range(conn, hook, None, dry_run=True) == len(ended)
    assert replay_range(conn, hook, None) == len(ended)
    assert replayed_from(conn) == ended
    assert replay_range(conn, hook, "cancelled") == 1
    assert replay_range(conn, hook, "purged") == 1
    assert replayed_from(conn)[-2:] == [cancelled, purged]


def test_the_seed_examples_run_as_written(conn, hook, history):
    conn.execute("UPDATE courier.archive SET created_at = '2025-01-10'")
    conn.execute("SELECT courier.maintain_archive_partitions(3)")
    assert scalar(conn, "SELECT courier.replay_range(1, '2025-01-01', '2025-01-31', 'failed')") == 3
    # The failed ones were replayed just now: a message is replayed once.
    assert scalar(conn, "SELECT courier.replay_range(p_endpoint_id := 1, p_from_ts := '2025-01-01'::timestamptz, "
                        "p_to_ts := '2025-01-31'::timestamptz)") == 9 - 3
    assert scalar(conn, "SELECT courier.replay_message(%s)", (history["completed"][0],)) > 0  # its copy


def test_a_dry_run_counts_and_enqueues_nothing(conn, hook, history):
    assert replay_range(conn, hook, "failed", dry_run=True) == 3
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.replays") == 0


def test_an_interrupted_replay_resumes_without_duplicates(conn, hook):
    conn.execute("SELECT courier.set_setting('max_queue_size', '1200')")
    for n in range(1, 2501):
        archive_row(conn, n, datetime.now(UTC), endpoint=hook)

    done, interruption = 0, None
    while True:  # what the CLI does: one batch per transaction until a short one
        try:
            n = replay_range(conn, hook, batch_size=500)
        except psycopg.errors.ConfigurationLimitExceeded as error:
            interruption = error
            break
        done += n
    assert interruption is not None and done == 1000  # the third batch would pass max_queue_size
    assert replay_range(conn, hook, dry_run=True) == 1500  # the dry run of the resumable replay

    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    assert replay_range(conn, hook) == 1500  # resumes after the last committed batch
    origins = Counter(replayed_from(conn))
    assert sorted(origins) == list(range(1, 2501)) and set(origins.values()) == {1}
    replay = conn.execute("SELECT state, replayed FROM courier.replays").fetchall()
    assert replay == [("finished", 2500)]
    # Finished, the same range again enqueues nothing: each message was replayed once.
    assert replay_range(conn, hook, dry_run=True) == 0
    assert replay_range(conn, hook, dry_run=True, again=True) == 2500


def test_replaying_a_range_twice_enqueues_once_and_says_what_it_skipped(conn, hook, history):
    everything = sorted(i for ids in history.values() for i in ids)
    assert replay_range(conn, hook) == len(everything)
    counts = "SELECT * FROM courier.count_replay_range(%s, %s, %s)"
    assert conn.execute(counts, (hook, FAR_PAST, FAR_FUTURE)).fetchone() == (0, len(everything))
    assert replay_range(conn, hook, dry_run=True) == 0
    assert replay_range(conn, hook) == 0  # the second run: nothing twice
    batches = []
    while not batches or scalar(conn, "SELECT count(*) FROM courier.replays WHERE state = 'running'"):
        batches.append(replay_range(conn, hook, batch_size=2))  # nor batch by batch, as the CLI runs it
    assert batches == [0] * 5  # 9 messages, 2 a batch
    assert Counter(replayed_from(conn)) == Counter(everything)
    finished = conn.execute("SELECT details FROM courier.event_log WHERE event_type = 'archive.replay_finished' "
                            "ORDER BY id").fetchall()
    assert [row[0]["replayed"] for row in finished] == [len(everything), 0, 0]


def test_again_enqueues_a_fresh_copy(conn, hook, history):
    failed = history["failed"]
    assert replay_range(conn, hook, "failed") == len(failed)
    assert replay_range(conn, hook, "failed", dry_run=True, again=True) == len(failed)
    assert replay_range(conn, hook, "failed", again=True) == len(failed)
    assert Counter(replayed_from(conn)) == Counter(failed * 2)
    copies = conn.execute("SELECT archive_id, copies, message_id FROM courier.replayed_messages ORDER BY 1").fetchall()
    newest = dict(conn.execute("SELECT (metadata ->> 'replayed_from')::bigint, max(id) FROM courier.queue GROUP BY 1"))
    assert copies == [(i, 2, newest[i]) for i in sorted(failed)]


def test_replay_message_twice_enqueues_once_unless_again(conn, hook, history):
    original = history["completed"][0]
    replay_once = "SELECT * FROM courier.replay_archived_message(%s)"
    first = conn.execute(replay_once, (original,)).fetchone()
    assert first[1] is True
    assert conn.execute(replay_once, (original,)).fetchone() == (first[0], False)
    assert scalar(conn, "SELECT courier.replay_message(%s)", (original,)) == first[0]  # the seed's form: the copy
    assert replayed_from(conn) == [original]
    fresh = conn.execute("SELECT * FROM courier.replay_archived_message(%s, true)", (original,)).fetchone()
    assert fresh[1] is True and fresh[0] > first[0]
    assert replayed_from(conn) == [original, original]
    # A range replay counts it as replayed before, and skips it.
    assert replay_range(conn, hook, "completed") == len(history["completed"]) - 1
    assert Counter(replayed_from(conn))[original] == 2


def test_replay_message(conn, hook, history):
    original = history["failed"][0]
    new_id = scalar(conn, "SELECT courier.replay_message(%s)", (original,))
    row = conn.execute("SELECT status, payload, metadata FROM courier.queue WHERE id = %s", (new_id,)).fetchone()
    assert row == ("pending", {"n": 1}, {"replayed_from": original})
    event = conn.execute("SELECT details FROM courier.event_log WHERE event_type = 'archive.replay_message'"
                         ).fetchone()[0]
    assert event == {"archive_id": original, "message_id": new_id, "original_status": "failed"}


@pytest.mark.parametrize(("call", "error"), [
    ("SELECT courier.replay_message(424242)", psycopg.errors.NoDataFound),
    ("SELECT courier.replay_range(999, now() - interval '1 day', now())", psycopg.errors.NoDataFound),
    ("SELECT courier.replay_range(1, now(), now() - interval '1 day')", psycopg.errors.InvalidParameterValue),
    ("SELECT courier.replay_range(1, now() - interval '1 day', now(), 'delivered')",
     psycopg.errors.InvalidParameterValue),
])
def test_bad_replays_get_a_clear_error(conn, hook, call, error):
    with pytest.raises(error):
        conn.execute(call)


def test_sqlkit_maps_replay_errors(dsn, hook):
    from sqlkit import archive
    from sqlkit.connection import connect

    with connect(dsn) as conn:
        with pytest.raises(NotFound, match="archived message 424242 does not exist"):
            archive.replay_message(conn, 424242)
        with pytest.raises(InvalidInput, match="p_status must be completed, failed, expired, cancelled or purged"):
            archive.count_replayable(conn, archive.ReplayRange(hook, FAR_PAST, FAR_FUTURE, "nope"))


def test_a_replay_batch_larger_than_one_chunk_does_not_finish_early(conn, hook):
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("INSERT INTO courier.archive (id, endpoint_id, payload, status, completed_at, created_at) "
                 "SELECT g, %s, '{}', 'completed', now(), now() FROM generate_series(1, 25000) g", (hook,))
    assert replay_range(conn, hook, batch_size=15_000) == 15_000  # two internal chunks: 10,000 and 5,000
    assert conn.execute("SELECT state, replayed FROM courier.replays").fetchall() == [("running", 15_000)]
    assert replay_range(conn, hook, batch_size=15_000) == 10_000
    assert conn.execute("SELECT state, replayed FROM courier.replays").fetchall() == [("finished", 25_000)]


def test_outcome_counters_follow_dead_letters_expiry_and_replays(conn, hook, history):
    conn.execute("SELECT courier.replay_message(%s)", (history["completed"][0],))
    counters = dict(conn.execute("SELECT metric_name, metric_value FROM courier.metrics() "
                                 "WHERE metric_type = 'counter'").fetchall())
    assert counters["messages_delivered_total"] == 4
    assert counters["messages_dead_lettered_total"] == 3
    assert counters["messages_expired_total"] == 2
    assert counters["messages_replayed_total"] == 1
