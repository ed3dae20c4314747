"""Delivery outcomes in SQL (ulak-reliability): backoff, circuit breaker, DLQ, recovery, rate limit."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.helpers import leases, message_status, scalar
from tests.helpers import report as report_with_leases


def endpoint_id(conn, name: str = "hook") -> int:
    return scalar(conn, "SELECT id FROM courier.endpoints WHERE name = %s", (name,))


@pytest.fixture
def hook(conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    return endpoint_id(conn)


def send(conn, n: int = 1, name: str = "hook") -> list[int]:
    return scalar(conn, "SELECT courier.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                        "FROM generate_series(1, %s) g))", (name, n))


def claim(conn, endpoint: int, batch: int = 10, worker: str = "w") -> list[int]:
    return [row[0] for row in conn.execute("SELECT id FROM courier.claim_batch(%s, %s, %s)",
                                           (worker, batch, endpoint))]


def report(conn, ids: list[int], outcome: str, error: str | None = "boom", retry_after: int | None = None):
    """(delivered, retried, dead_lettered), reported by the claims' holder."""
    return report_with_leases(conn, ids, [outcome] * len(ids), [error] * len(ids), [retry_after] * len(ids))[:3]


def status_of(conn, message_id: int) -> str | None:
    return message_status(conn, message_id)


def make_due(conn) -> None:
    conn.execute("UPDATE courier.queue SET next_retry_at = now() WHERE status = 'pending'")


# Backoff ------------------------------------------------------------------------------

@pytest.mark.parametrize(("policy", "expected"), [
    ("{}", [10, 20, 40, 80, 160, 300, 300, 300, 300, 300, 300, 300]),
    ('{"backoff": "exponential"}', [10, 20, 40, 80, 160, 300, 300, 300, 300, 300, 300, 300]),
    ('{"backoff": "linear"}', [10, 40, 70, 100, 130, 160, 190, 220, 250, 280, 300, 300]),
    ('{"backoff": "fixed"}', [10] * 12),
    ('{"backoff": "linear", "base_delay_seconds": 5, "increment_seconds": 15, "max_delay_seconds": 600}',
     [5, 20, 35, 50, 65, 80, 95, 110, 125, 140, 155, 170]),
])
def test_retry_delay_follows_each_policy(conn, policy, expected):
    delays = [scalar(conn, "SELECT courier.retry_delay(%s::jsonb, %s)", (policy, n)) for n in range(12)]
    assert delays == expected


def test_exponential_backoff_does_not_overflow(conn):
    assert scalar(conn, "SELECT courier.retry_delay('{}', 2147483647)") == 300
    conn.execute("SELECT courier.set_setting('retry_max_delay', '86400')")
    assert scalar(conn, "SELECT courier.retry_delay('{}', 63)") == 86400


def test_global_settings_drive_the_default_policy(conn):
    conn.execute("SELECT courier.set_setting('retry_base_delay', '3')")
    conn.execute("SELECT courier.set_setting('retry_increment', '4')")
    assert scalar(conn, "SELECT courier.retry_delay('{\"backoff\": \"linear\"}', 2)") == 11


def test_retryable_failure_is_retried_after_the_backoff(conn, hook):
    (message,) = send(conn)
    claim(conn, hook)
    assert report(conn, [message], "retryable", "[RETRYABLE] HTTP 503") == (0, 1, 0)
    row = conn.execute("SELECT status, retry_count, extract(epoch FROM next_retry_at - now())::int, last_error "
                       "FROM courier.queue WHERE id = %s", (message,)).fetchone()
    assert row[0:2] == ("pending", 1) and 8 <= row[2] <= 10 and row[3] == "[RETRYABLE] HTTP 503"
    assert claim(conn, hook) == []  # not due yet


def test_retry_after_overrides_backoff_and_is_capped(conn, hook):
    first, second = send(conn, 2)
    claim(conn, hook)
    report(conn, [first], "retryable", "429", retry_after=120)
    report(conn, [second], "retryable", "503", retry_after=10**7)
    delays = dict(conn.execute("SELECT id, extract(epoch FROM next_retry_at - now())::int FROM courier.queue"))
    assert 118 <= delays[first] <= 120
    assert 86398 <= delays[second] <= 86400


def test_exhausted_retries_go_to_the_dlq_with_their_history(conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}', '{\"max_retries\": 2, \"backoff\": \"fixed\"}')")
    hook = endpoint_id(conn)
    (message,) = send(conn)
    for attempt in range(3):
        assert claim(conn, hook) == [message], attempt
        report(conn, [message], "retryable", f"[RETRYABLE] attempt {attempt + 1}")
        make_due(conn)
    assert status_of(conn, message) == "failed"  # archived as dead-lettered
    history = scalar(conn, "SELECT error_history FROM courier.dlq WHERE original_message_id = %s", (message,))
    assert [h["error"] for h in history] == [f"[RETRYABLE] attempt {n}" for n in (1, 2, 3)]


def test_permanent_error_goes_straight_to_the_dlq(conn, hook):
    (message,) = send(conn)
    claim(conn, hook)
    assert report(conn, [message], "permanent", "[PERMANENT] HTTP 400") == (0, 0, 1)
    row = conn.execute("SELECT status, retry_count, last_error FROM courier.dlq").fetchone()
    assert row == ("failed", 1, "[PERMANENT] HTTP 400")


@pytest.mark.parametrize("auto_disable", [True, False])
def test_gone_dead_letters_and_optionally_disables(conn, auto_disable):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', jsonb_build_object('auto_disable_on_gone', %s))",
                 (auto_disable,))
    hook = endpoint_id(conn)
    (message,) = send(conn)
    claim(conn, hook)
    report(conn, [message], "disable", "[DISABLE] HTTP 410")
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 1
    assert scalar(conn, "SELECT enabled FROM courier.endpoints") is (not auto_disable)
    events = [row[0] for row in conn.execute("SELECT event_type FROM courier.event_log")]
    assert ("endpoint.auto_disabled" in events) is auto_disable


def test_dlq_keeps_the_full_message(conn, hook):
    message = scalar(conn, """SELECT courier.send_with_options('hook', '{"order": 9}'::jsonb, p_priority := 7,
        p_ordering_key := 'k', p_correlation_id := '550e8400-e29b-41d4-a716-446655440000',
        p_headers := '{"X-A": "1"}', p_metadata := '{"m": 1}')""")
    claim(conn, hook)
    report(conn, [message], "permanent", "bad")
    row = conn.execute("SELECT original_message_id, endpoint_name, payload, headers, metadata, priority, "
                       "ordering_key, correlation_id::text FROM courier.dlq").fetchone()
    assert row == (message, "hook", {"order": 9}, {"X-A": "1"}, {"m": 1}, 7, "k",
                   "550e8400-e29b-41d4-a716-446655440000")


def test_success_completes_and_counts(conn, hook):
    ids = send(conn, 3)
    claim(conn, hook)
    assert report(conn, ids, "success", None) == (3, 0, 0)
    assert {status_of(conn, i) for i in ids} == {"completed"}
    assert scalar(conn, "SELECT last_success_at IS NOT NULL FROM courier.endpoints")


def test_an_all_success_report_archives_responses_and_counts_per_endpoint(conn, hook):
    """The all-success path (_report_delivered): captured responses, delivery totals and
    last_success_at of every endpoint in the batch, and a stale lease left alone."""
    conn.execute("SELECT courier.create_endpoint('other', 'noop', '{}')")
    other = endpoint_id(conn, "other")
    ids = send(conn, 2) + send(conn, 1, "other")
    held = {row[0]: row[1] for row in conn.execute(
        "SELECT id, lease FROM courier.claim_batch('w', 10, %s) UNION ALL "
        "SELECT id, lease FROM courier.claim_batch('w', 10, %s)", (hook, other))}
    stale = send(conn, 1)[0]
    held[stale] = 0  # never claimed: pending, and its report is a stale one
    reported = [*ids, stale]
    row = conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, %s, %s, NULL, %s::jsonb[])",
                       (reported, [held[i] for i in reported], ["success"] * 4, [None] * 4,
                        ['{"status": 200}', None, '{"status": 202}', None])).fetchone()
    assert row == (3, 0, 0, 1)
    archived = dict(conn.execute("SELECT id, response FROM courier.archive WHERE status = 'completed'").fetchall())
    assert archived == {ids[0]: {"status": 200}, ids[1]: None, ids[2]: {"status": 202}}
    assert status_of(conn, stale) == "pending"
    totals = dict(conn.execute("SELECT endpoint_id, sum(total)::int FROM courier.delivery_totals "
                               "WHERE outcome = 'delivered' GROUP BY endpoint_id").fetchall())
    assert totals == {hook: 2, other: 1}
    assert scalar(conn, "SELECT bool_and(last_success_at IS NOT NULL) FROM courier.endpoints")
    depth = dict(conn.execute("SELECT status, sum(messages)::int FROM courier.queue_depth GROUP BY status").fetchall())
    assert depth.get("processing", 0) == 0 and depth["pending"] == 1


def test_an_all_success_report_closes_a_half_open_circuit(conn, hook):
    open_circuit(conn, hook)
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    make_due(conn)
    (probe,) = claim(conn, hook)
    assert circuit(conn)[0] == "half_open"
    assert report(conn, [probe], "success", None) == (1, 0, 0)
    assert circuit(conn) == ("closed", 0)


def test_an_all_success_report_finds_its_rows_by_primary_key(conn, hook):
    """Analyzed while nothing was in processing, the planner thought the processing index held
    one row; the cached generic plan of the report must still look the ids up by primary key."""
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    send(conn, 5000)
    conn.execute("ANALYZE courier.queue")
    # By the server's own counters rather than auto_explain, which the embedded server lacks.
    before = processing_index_reads(conn)
    for _ in range(7):  # past the point where a plan cache settles on its plan
        ids = claim(conn, hook, 100)
        assert report(conn, ids, "success", None) == (100, 0, 0)
    assert processing_index_reads(conn) == before
    assert scalar(conn, "SELECT count(*) FROM courier.archive") == 700


def processing_index_reads(conn) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT idx_scan, idx_tup_read FROM pg_stat_user_indexes "
                        "WHERE indexrelid = 'courier.queue_processing_started_idx'::regclass").fetchone()


def test_a_late_report_after_recovery_changes_nothing(conn, hook):
    (message,) = send(conn)
    claim(conn, hook)
    conn.execute("UPDATE courier.queue SET processing_started_at = now() - interval '1 hour'")
    assert scalar(conn, "SELECT courier.recover_stale_messages()") == 1
    assert report(conn, [message], "success", None) == (0, 0, 0)
    assert status_of(conn, message) == "pending"


def test_unknown_outcome_is_refused(conn, hook):
    (message,) = send(conn)
    claim(conn, hook)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="unknown outcome"):
        report(conn, [message], "maybe")


# Circuit breaker ----------------------------------------------------------------------

def circuit(conn) -> tuple[str, int]:
    return conn.execute("SELECT circuit_state, circuit_failure_count FROM courier.endpoints").fetchone()


def open_circuit(conn, hook: int, threshold: int = 3) -> None:
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', %s)", (str(threshold),))
    ids = send(conn, threshold)
    claim(conn, hook)
    report(conn, ids, "retryable", "503")


def test_failures_open_the_circuit_at_the_threshold(conn, hook):
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '3')")
    ids = send(conn, 2)
    claim(conn, hook)
    report(conn, ids, "retryable", "503")
    assert circuit(conn) == ("closed", 2)
    make_due(conn)
    claim(conn, hook, 1)
    report(conn, [ids[0]], "retryable", "503")
    assert circuit(conn) == ("open", 3)
    assert "circuit.opened" in [r[0] for r in conn.execute("SELECT event_type FROM courier.event_log")]


def test_a_success_resets_the_failure_count(conn, hook):
    ids = send(conn, 2)
    claim(conn, hook)
    report(conn, [ids[0]], "retryable", "503")
    assert circuit(conn) == ("closed", 1)
    report(conn, [ids[1]], "success", None)
    assert circuit(conn) == ("closed", 0)


def test_permanent_errors_do_not_trip_the_circuit(conn, hook):
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '1')")
    ids = send(conn, 2)
    claim(conn, hook)
    report(conn, ids, "permanent", "400")
    assert circuit(conn) == ("closed", 0)


def test_open_circuit_claims_nothing_until_the_cooldown(conn, hook):
    open_circuit(conn, hook)
    make_due(conn)
    assert claim(conn, hook) == []
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    probe = claim(conn, hook)
    assert len(probe) == 1, "one probe after the cooldown"
    assert circuit(conn)[0] == "half_open"
    assert claim(conn, hook) == [], "nothing else while the probe is out"


def test_successful_probe_closes_the_circuit(conn, hook):
    open_circuit(conn, hook)
    make_due(conn)
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    report(conn, claim(conn, hook), "success", None)
    assert circuit(conn) == ("closed", 0)
    assert len(claim(conn, hook)) == 2


def test_failed_probe_reopens_with_a_fresh_cooldown(conn, hook):
    open_circuit(conn, hook)
    make_due(conn)
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    report(conn, claim(conn, hook), "retryable", "503")
    assert circuit(conn)[0] == "open"
    remaining = scalar(conn, "SELECT extract(epoch FROM circuit_half_open_at - now()) FROM courier.endpoints")
    assert 25 <= remaining <= 30
    make_due(conn)
    assert claim(conn, hook) == []


def test_concurrent_workers_send_a_single_probe(dsn, conn, hook):
    open_circuit(conn, hook)
    make_due(conn)
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    barrier = threading.Barrier(8)

    def try_claim(worker: int) -> int:
        with psycopg.connect(dsn, autocommit=True) as own:
            barrier.wait()
            return len(claim(own, hook, 10, f"w{worker}"))

    with ThreadPoolExecutor(8) as pool:
        claimed = list(pool.map(try_claim, range(8)))
    assert sorted(claimed) == [0] * 7 + [1]


def test_half_open_with_nothing_to_probe_goes_back_to_open(conn, hook):
    """The cooldown passes but nothing is due: no probe, so the circuit stays open and the
    next worker may try again without waiting a fresh cooldown."""
    open_circuit(conn, hook)  # the three failed messages wait out their backoff: none is due
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    assert claim(conn, hook) == []
    assert circuit(conn)[0] == "open"
    make_due(conn)
    assert len(claim(conn, hook)) == 1 and circuit(conn)[0] == "half_open"


def test_an_unanswered_probe_is_sent_again_after_a_cooldown(conn, hook):
    """The probe's worker died: after a whole cooldown in half_open, one more probe goes out."""
    open_circuit(conn, hook)
    make_due(conn)
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    first = claim(conn, hook, worker="dies")
    assert len(first) == 1 and claim(conn, hook) == []
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '31 seconds'")
    second = claim(conn, hook, worker="survivor")
    assert len(second) == 1 and second != first
    assert claim(conn, hook) == []


def test_concurrent_outcome_reports_are_serialised_per_endpoint(dsn, conn, hook):
    """Eight workers report one failure each at once; the advisory lock makes the count
    exact, so the circuit opens at the threshold exactly once."""
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '8')")
    ids = send(conn, 8)
    claim(conn, hook, 8)
    barrier = threading.Barrier(8)

    def report_one(message: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            barrier.wait()
            report(own, [message], "retryable", "503")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(report_one, ids))
    assert circuit(conn) == ("open", 8)
    assert scalar(conn, "SELECT count(*) FROM courier.event_log WHERE event_type = 'circuit.opened'") == 1


def test_reset_circuit_breaker(conn, hook):
    open_circuit(conn, hook)
    conn.execute("SELECT courier.reset_circuit_breaker('hook')")
    assert circuit(conn) == ("closed", 0)
    assert scalar(conn, "SELECT event_type FROM courier.event_log ORDER BY id DESC LIMIT 1") == "circuit.reset"
    assert scalar(conn, "SELECT metric_value FROM courier.metrics() WHERE metric_name = 'endpoint_circuit_state'") == 0


def test_circuit_state_in_health_and_metrics(conn, hook):
    open_circuit(conn, hook)
    assert scalar(conn, "SELECT circuit_state FROM courier.get_endpoint_health('hook')") == "open"
    assert scalar(conn, "SELECT metric_value FROM courier.metrics() WHERE metric_name = 'endpoint_circuit_state'") == 2


# DLQ ----------------------------------------------------------------------------------

def dead_letter(conn, hook: int, n: int) -> list[int]:
    ids = send(conn, n)
    claim(conn, hook, n)
    report(conn, ids, "permanent", "400")
    return [row[0] for row in conn.execute("SELECT id FROM courier.dlq ORDER BY id")]


def test_redrive_message_requeues_and_keeps_the_audit_row(conn, hook):
    (dlq_id,) = dead_letter(conn, hook, 1)
    new_id = scalar(conn, "SELECT courier.redrive_message(%s)", (dlq_id,))
    assert status_of(conn, new_id) == "pending"
    assert conn.execute("SELECT status, redriven_message_id FROM courier.dlq").fetchone() == ("redriven", new_id)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="already redriven"):
        conn.execute("SELECT courier.redrive_message(%s)", (dlq_id,))


def test_redrive_clears_idempotency_key_and_expiry_and_resets_retries(conn, hook):
    message = scalar(conn, "SELECT courier.send_with_options('hook', '{}'::jsonb, p_idempotency_key := 'k', "
                           "p_expires_at := now() + interval '1 hour')")
    claim(conn, hook)
    report(conn, [message], "permanent", "400")
    new_id = scalar(conn, "SELECT courier.redrive_message((SELECT id FROM courier.dlq))")
    row = conn.execute("SELECT idempotency_key, expires_at, retry_count FROM courier.queue WHERE id = %s",
                       (new_id,)).fetchone()
    assert row == (None, None, 0)


def test_redrive_endpoint_in_batches_and_in_creation_order(conn, hook):
    dead_letter(conn, hook, 25)
    counts = []
    while n := scalar(conn, "SELECT courier.redrive_endpoint('hook', 10)"):
        counts.append(n)
    assert counts == [10, 10, 5]
    payloads = [row[0]["n"] for row in conn.execute("SELECT payload FROM courier.queue WHERE status = 'pending' "
                                                    "ORDER BY id")]
    assert payloads == list(range(1, 26))


def test_redrive_all_and_summary(conn, hook):
    conn.execute("SELECT courier.create_endpoint('other', 'noop', '{}')")
    dead_letter(conn, hook, 3)
    ids = send(conn, 2, "other")
    claim(conn, endpoint_id(conn, "other"))
    report(conn, ids, "permanent", "400")
    conn.execute("SELECT courier.redrive_message((SELECT min(id) FROM courier.dlq))")
    summary = {row[0]: row[1:3] for row in conn.execute("SELECT * FROM courier.dlq_summary()")}
    assert summary == {"hook": (2, 1), "other": (2, 0)}
    assert scalar(conn, "SELECT courier.redrive_all()") == 4
    dlq_depth = {(row[1]["endpoint"], row[1]["status"]): row[0] for row in conn.execute(
        "SELECT metric_value, labels FROM courier.metrics() WHERE metric_name = 'dlq_depth'")}
    assert dlq_depth == {("hook", "failed"): 0, ("hook", "redriven"): 3,
                         ("other", "failed"): 0, ("other", "redriven"): 2}


def test_cleanup_dlq_honours_retention(conn, hook):
    dead_letter(conn, hook, 3)
    conn.execute("UPDATE courier.dlq SET failed_at = now() - interval '31 days' "
                 "WHERE id = (SELECT min(id) FROM courier.dlq)")
    assert scalar(conn, "SELECT courier.cleanup_dlq()") == 1
    conn.execute("SELECT courier.set_setting('dlq_retention_days', '1')")
    conn.execute("UPDATE courier.dlq SET failed_at = now() - interval '2 days'")
    assert scalar(conn, "SELECT courier.cleanup_dlq()") == 2


# Stale recovery, rate limit, heartbeats -----------------------------------------------

def test_stale_processing_messages_are_recovered(conn, hook):
    fresh, stale = send(conn, 2)
    claim(conn, hook)
    conn.execute("UPDATE courier.queue SET processing_started_at = now() - interval '301 seconds' WHERE id = %s",
                 (stale,))
    assert scalar(conn, "SELECT courier.recover_stale_messages()") == 1
    row = conn.execute("SELECT status, retry_count, last_error FROM courier.queue WHERE id = %s", (stale,)).fetchone()
    assert row == ("pending", 1, "Recovered from stale processing state")
    assert status_of(conn, fresh) == "processing"
    assert claim(conn, hook) == [stale]


def test_a_claim_takes_the_lean_path_only_while_nothing_is_scheduled_or_keyed(conn, hook):
    """claim_batch claims with _claim_ready, which skips the priority levels of scheduled and
    retrying messages and the ordering-key checks, only when its probes found neither kind
    waiting: a due retry of a higher priority still comes first, and a keyed message is taken
    in its key's order."""
    low = send(conn, 3)
    high = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_priority => 5, "
                        "p_scheduled_at => now() + interval '1 minute')")
    conn.execute("UPDATE courier.queue SET scheduled_at = now() WHERE id = %s", (high,))  # due now
    assert claim(conn, hook, 2) == [high, low[0]]
    a1 = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_ordering_key => 'cust-a')")
    a2 = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_ordering_key => 'cust-a')")
    assert claim(conn, hook, 10) == [low[1], low[2], a1]
    assert status_of(conn, a2) == "pending"


def test_the_lean_claim_returns_a_message_as_the_full_claim_does(conn):
    """_claim_ready and _claim_due are two statements for one claim: the same message, with every
    feature the lean path takes (correlation id, idempotency key, headers, metadata, expiry, its
    own max_retries), comes back the same from both."""
    columns = ("endpoint_name, protocol, payload, headers, metadata, priority, retry_count, max_retries, "
               "correlation_id, ordering_key, idempotency_key, scheduled_at, expires_at")
    claimed = {}
    for name, keyed in (("lean", False), ("full", True)):
        endpoint = scalar(conn, "SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
        conn.execute("SELECT courier.send_with_options(%s, '{\"n\": 1}', p_priority => 4, p_idempotency_key => 'k-1', "
                     "p_correlation_id => '550e8400-e29b-41d4-a716-446655440000', p_headers => '{\"h\": \"v\"}', "
                     "p_metadata => '{\"m\": 1}', p_max_retries => 7)", (name,))
        conn.execute("UPDATE courier.endpoints SET ordering_keys = %s WHERE id = %s", (keyed, endpoint))
        claimed[name] = conn.execute(f"SELECT {columns} FROM courier.claim_batch('w', 10, %s)", (endpoint,)).fetchall()
    assert claimed["lean"] == [("lean", *claimed["full"][0][1:])]
    assert claimed["lean"][0][8] is not None and claimed["lean"][0][10] == "k-1"


def test_a_claim_on_an_unmarked_endpoint_hands_out_no_keyed_message(conn, hook):
    """The mark of an endpoint whose messages have carried an ordering key (_note_ordering_keys)
    decides only whether the claim checks keys, never whether a key is honoured: on an endpoint
    not marked (as one read just before its first keyed message committed) the claim takes only
    messages without a key, and the next claim, reading the mark, takes the key's head."""
    a1 = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_ordering_key => 'cust-a')")
    a2 = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_ordering_key => 'cust-a')")
    [plain] = send(conn, 1)
    conn.execute("UPDATE courier.endpoints SET ordering_keys = false WHERE id = %s", (hook,))
    assert claim(conn, hook) == [plain]
    assert claim(conn, hook) == []
    conn.execute("UPDATE courier.endpoints SET ordering_keys = true WHERE id = %s", (hook,))
    assert claim(conn, hook) == [a1]
    assert status_of(conn, a2) == "pending"


def test_rate_limit_defers_instead_of_failing(conn):
    conn.execute("""SELECT courier.create_endpoint('hook', 'noop', '{"rate_limit": {"rate": 1, "burst": 3}}')""")
    hook = endpoint_id(conn)
    send(conn, 10)
    assert len(claim(conn, hook, 10)) == 3  # the burst
    assert claim(conn, hook, 10) == []  # throttled; nothing failed
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending' AND retry_count = 0") == 7
    conn.execute("UPDATE courier.endpoints SET rate_refilled_at = now() - interval '2 seconds'")
    assert len(claim(conn, hook, 10)) == 2


def test_release_returns_claims_without_counting_an_attempt(conn, hook):
    ids = send(conn, 3)
    claim(conn, hook)
    assert scalar(conn, "SELECT courier.release_batch(%s, %s)", (ids, leases(conn, ids))) == 3
    assert scalar(conn, "SELECT sum(retry_count) FROM courier.queue WHERE status = 'pending'") == 0


def test_worker_heartbeats(conn):
    conn.execute("SELECT courier.worker_heartbeat('w1', 'host-a', 42, 16, 3, 100, 2, 'running')")
    conn.execute("SELECT courier.worker_heartbeat('w1', 'host-a', 42, 16, 0, 150, 2, 'draining')")
    row = conn.execute("SELECT worker_id, state, in_flight, delivered, alive "
                       "FROM courier.get_worker_status()").fetchone()
    assert row == ("w1", "draining", 0, 150, True)
    conn.execute("UPDATE courier.workers SET last_heartbeat = now() - interval '1 minute'")
    assert scalar(conn, "SELECT alive FROM courier.get_worker_status()") is False


def test_an_idle_open_circuit_logs_no_event_per_poll(conn, hook):
    open_circuit(conn, hook)
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    for _ in range(5):
        assert claim(conn, hook) == []  # nothing due: no probe
    assert scalar(conn, "SELECT count(*) FROM courier.event_log WHERE event_type = 'circuit.half_open'") == 0
    make_due(conn)
    assert len(claim(conn, hook)) == 1
    assert scalar(conn, "SELECT count(*) FROM courier.event_log WHERE event_type = 'circuit.half_open'") == 1


def test_retries_not_yet_due_leave_the_claim_on_its_lean_path(conn, hook):
    """A retry backing off, or a message scheduled for later, sends the claim down the full path
    (_claim_due) only once it is due: until then the lean claim (_claim_ready) takes the ready
    messages, and the due message, of a higher priority, comes first as soon as it is due."""
    ready = send(conn, 2)
    later = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_priority => 5, "
                         "p_scheduled_at => now() + interval '1 minute')")
    conn.execute("SET track_functions = 'pl'")

    def calls() -> dict[str, int]:
        """This backend's calls of each claim not yet flushed to the statistics: compare two
        readings in one transaction."""
        return dict(conn.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions "
                                 "WHERE funcname IN ('_claim_ready', '_claim_due')").fetchall())

    def claimed_by(batch: int) -> tuple[list[int], list[str]]:
        with conn.transaction():
            before = calls()
            ids = claim(conn, hook, batch)
            after = calls()
        return ids, [name for name, n in sorted(after.items()) if n > before.get(name, 0)]

    assert claimed_by(1) == ([ready[0]], ["_claim_ready"])
    conn.execute("UPDATE courier.queue SET scheduled_at = now() WHERE id = %s", (later,))  # due now
    assert claimed_by(2) == ([later, ready[1]], ["_claim_due"])
