"""The typed sqlkit functions the console panes read through: DLQ, message search, circuit
reset and delivery totals, on real data, and the plans that keep them cheap at any depth."""

from __future__ import annotations

import itertools
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sqlkit import dlq, endpoints, messages, observability, queries
from sqlkit.dlq import DlqDetail, DlqEntry, DlqSummary
from sqlkit.errors import InvalidInput, NotFound, WrongState
from sqlkit.messages import MessageSummary
from sqlkit.observability import DeliveryTotals
from tests.helpers import report as report_with_leases
from tests.helpers import scalar
from tests.test_claim_plans import explain


def endpoint_id(conn, name: str) -> int:
    return scalar(conn, "SELECT id FROM courier.endpoints WHERE name = %s", (name,))


def send(conn, endpoint: str, n: int = 1, *, priority: int = 0, ordering_key: str | None = None,
         correlation_id: uuid.UUID | None = None, headers: str | None = None) -> list[int]:
    return [scalar(conn, "SELECT courier.send_with_options(%s, %s::jsonb, p_priority := %s, p_ordering_key := %s, "
                         "p_correlation_id := %s, p_headers := %s::jsonb)",
                   (endpoint, f'{{"n": {i}}}', priority, ordering_key, correlation_id, headers)) for i in range(n)]


def claim(conn, endpoint: str, batch: int) -> list[int]:
    return [row[0] for row in conn.execute("SELECT id FROM courier.claim_batch('w', %s, %s)",
                                           (batch, endpoint_id(conn, endpoint)))]


def report(conn, ids: list[int], outcome: str, error: str | None = None) -> None:
    report_with_leases(conn, ids, [outcome] * len(ids), [error] * len(ids))


def dead_letter(conn, endpoint: str, n: int, **options: Any) -> list[int]:
    """Send n messages and fail them permanently through the worker's own path."""
    ids = send(conn, endpoint, n, **options)
    claimed = claim(conn, endpoint, n)
    assert sorted(claimed) == sorted(ids)
    report(conn, ids, "permanent", "[PERMANENT] HTTP 400")
    return [row[0] for row in conn.execute("SELECT id FROM courier.dlq WHERE original_message_id = ANY (%s) "
                                           "ORDER BY id", (ids,))]


@pytest.fixture
def two_endpoints(conn):
    for name in ("billing", "shipping"):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    return conn


# DLQ ------------------------------------------------------------------------------------

def test_dlq_list_get_summary_and_count(two_endpoints):
    conn = two_endpoints
    correlation = uuid.uuid4()
    billing = dead_letter(conn, "billing", 3, correlation_id=correlation,
                          headers='{"Authorization": "Bearer t0p-s3cret", "X-Tenant": "acme"}')
    shipping = dead_letter(conn, "shipping", 2)

    listed = dlq.list_entries(conn)
    assert all(type(e) is DlqEntry for e in listed)
    assert [e.id for e in listed] == sorted(billing + shipping, reverse=True)
    assert [e.id for e in dlq.list_entries(conn, endpoint="billing")] == billing[::-1]
    assert [e.id for e in dlq.list_entries(conn, limit=2)] == sorted(shipping, reverse=True)
    assert dlq.list_entries(conn, endpoint="nobody") == []
    entry = dlq.list_entries(conn, endpoint="billing")[0]
    assert (entry.endpoint_name, entry.status, entry.retry_count, entry.last_error, entry.correlation_id) == (
        "billing", "failed", 1, "[PERMANENT] HTTP 400", correlation)
    assert entry.redriven_at is None and entry.redriven_message_id is None
    assert isinstance(entry.failed_at, datetime) and isinstance(entry.original_created_at, datetime)

    detail = dlq.get(conn, billing[0])
    assert type(detail) is DlqDetail
    assert detail.payload == {"n": 0} and detail.endpoint_id == endpoint_id(conn, "billing")
    assert detail.headers["X-Tenant"] == "acme" and "t0p-s3cret" not in str(detail.headers)
    assert detail.error_history[0]["error"] == "[PERMANENT] HTTP 400" and detail.status == "failed"

    summary = dlq.summary(conn)
    assert all(type(s) is DlqSummary for s in summary)
    assert [(s.endpoint_name, s.failed_count, s.redriven_count) for s in summary] == [
        ("billing", 3, 0), ("shipping", 2, 0)]
    assert dlq.failed_count(conn) == 5 and dlq.failed_count(conn, "shipping") == 2
    assert dlq.failed_count(conn, "nobody") == 0


def test_dlq_status_filter_and_redrive_of_one_message(two_endpoints):
    conn = two_endpoints
    first, *rest = dead_letter(conn, "billing", 3)
    message_id = dlq.redrive_message(conn, first)
    assert scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (message_id,)) == "pending"
    (redriven,) = dlq.list_entries(conn, status="redriven")
    assert (redriven.id, redriven.status, redriven.redriven_message_id) == (first, "redriven", message_id)
    assert [e.id for e in dlq.list_entries(conn, status="failed")] == rest[::-1]
    assert [e.id for e in dlq.list_entries(conn, endpoint="billing", status="failed")] == rest[::-1]
    assert dlq.list_entries(conn, endpoint="shipping", status="failed") == []
    with pytest.raises(WrongState, match="already redriven"):
        dlq.redrive_message(conn, first)
    assert [(s.failed_count, s.redriven_count) for s in dlq.summary(conn)] == [(2, 1)]


def test_unknown_ids_and_names_raise_not_found(two_endpoints):
    conn = two_endpoints
    with pytest.raises(NotFound) as missing:
        dlq.get(conn, 999_999)
    assert missing.value.sqlstate == "P0002" and missing.value.hint
    with pytest.raises(NotFound, match="does not exist"):
        dlq.redrive_message(conn, 999_999)
    with pytest.raises(NotFound, match="does not exist"):
        dlq.redrive_batch(conn, "nobody")
    with pytest.raises(NotFound, match="does not exist"):
        endpoints.reset_circuit(conn, "nobody")


def test_redrive_everything_works_in_batches_and_reports_progress(two_endpoints):
    conn = two_endpoints
    entries = dead_letter(conn, "billing", 5)
    dead_letter(conn, "shipping", 1)
    seen: list[int] = []
    assert dlq.redrive_everything(conn, "billing", batch_size=2, progress=seen.append) == 5
    assert seen == [2, 4, 5]
    assert dlq.failed_count(conn, "billing") == 0 and dlq.failed_count(conn, "shipping") == 1
    redriven = dlq.list_entries(conn, endpoint="billing", status="redriven")
    assert sorted(e.id for e in redriven) == entries and all(e.redriven_message_id for e in redriven)
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 5
    assert dlq.redrive_batch(conn, "billing") == 0
    # Every endpoint, without a progress callback.
    assert dlq.redrive_everything(conn, None, batch_size=2) == 1
    assert dlq.failed_count(conn) == 0 and dlq.redrive_batch(conn, None) == 0


def test_redrive_batch_does_one_batch(two_endpoints):
    conn = two_endpoints
    dead_letter(conn, "billing", 3)
    dead_letter(conn, "shipping", 2)
    assert dlq.redrive_batch(conn, None, batch_size=4) == 4
    assert dlq.failed_count(conn) == 1
    assert dlq.redrive_batch(conn, None, batch_size=4) == 1


def test_cleanup_deletes_entries_past_retention(two_endpoints):
    conn = two_endpoints
    old = dead_letter(conn, "billing", 2)
    kept = dead_letter(conn, "shipping", 1)
    conn.execute("UPDATE courier.dlq SET failed_at = now() - interval '40 days' WHERE id = ANY (%s)", (old,))
    assert dlq.cleanup(conn) == 2
    assert [e.id for e in dlq.list_entries(conn)] == kept
    assert dlq.cleanup(conn) == 0


def test_summary_is_exact_and_names_dropped_endpoints(two_endpoints):
    """dlq_summary() reads counters and index probes now; it must agree with the aggregate
    over every row it replaced, including an endpoint dropped since its messages failed."""
    conn = two_endpoints
    billing = dead_letter(conn, "billing", 4)
    dead_letter(conn, "shipping", 3)
    dlq.redrive_message(conn, billing[1])
    base = datetime(2030, 1, 1, tzinfo=UTC)
    # Failure times that disagree with id order, so a shortcut by id would show.
    for offset, dlq_id in zip((5, 1, 9, 3), billing, strict=True):
        conn.execute("UPDATE courier.dlq SET failed_at = %s WHERE id = %s", (base + timedelta(hours=offset), dlq_id))
    conn.execute("SELECT courier.drop_endpoint('shipping')")
    aggregate = conn.execute("""
        SELECT endpoint_name, count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE status = 'redriven'),
               min(failed_at), max(failed_at)
        FROM courier.dlq GROUP BY endpoint_name ORDER BY endpoint_name""").fetchall()
    summary = dlq.summary(conn)
    assert [(s.endpoint_name, s.failed_count, s.redriven_count, s.oldest_failure, s.newest_failure)
            for s in summary] == aggregate
    assert (summary[0].oldest_failure, summary[0].newest_failure) == (base + timedelta(hours=1),
                                                                       base + timedelta(hours=9))
    assert summary[1].endpoint_name == "shipping"


# Endpoints and delivery totals ----------------------------------------------------------

def test_reset_circuit_closes_it_and_logs_the_reset(two_endpoints):
    conn = two_endpoints
    conn.execute("UPDATE courier.endpoints SET circuit_state = 'open', circuit_failure_count = 12 "
                 "WHERE name = 'billing'")
    assert endpoints.reset_circuit(conn, "billing") is None
    billing = endpoints.get(conn, "billing")
    assert (billing.circuit_state, billing.circuit_failure_count) == ("closed", 0)
    (event,) = observability.latest_events(conn, 10, event_type="circuit.reset")
    assert event.endpoint == "billing" and event.details["previous_state"] == "open"


def test_delivery_totals_count_each_outcome_per_endpoint(two_endpoints):
    conn = two_endpoints
    delivered = send(conn, "billing", 2)
    claim(conn, "billing", 2)
    report(conn, delivered, "success")
    (retried,) = send(conn, "billing")
    claim(conn, "billing", 1)
    report(conn, [retried], "retryable", "[RETRYABLE] HTTP 503")
    dead_letter(conn, "billing", 1)
    totals = observability.delivery_totals(conn)
    assert totals == {
        "billing": DeliveryTotals(delivered=2, failed_attempts=2, dead_lettered=1, expired=0, replayed=0),
        "shipping": DeliveryTotals(delivered=0, failed_attempts=0, dead_lettered=0, expired=0, replayed=0),
    }
    # The same counters metrics() exports.
    exported = {(m.labels["endpoint"], m.metric_name): m.metric_value for m in observability.metrics(conn)
                if m.metric_type == "counter" and "endpoint" in m.labels}
    assert exported[("billing", "messages_delivered_total")] == 2
    assert exported[("billing", "delivery_failures_total")] == 2
    assert exported[("billing", "messages_dead_lettered_total")] == 1


# Message search -------------------------------------------------------------------------

@pytest.fixture
def searchable(conn):
    """Messages on endpoints a and b in every state a search can meet; returns their ids."""
    for name in ("a", "b"):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    c1 = uuid.uuid4()
    m = {}
    (m[1],) = send(conn, "a", ordering_key="k1", correlation_id=c1)
    (m[2],) = send(conn, "a", priority=5)
    (m[3],) = send(conn, "a", ordering_key="k1")
    (m[4],) = send(conn, "a", priority=5, correlation_id=c1)
    (m[5],) = send(conn, "b", correlation_id=c1)
    (m[6],) = send(conn, "b", priority=9, ordering_key="k2")
    (m[7],) = send(conn, "b")
    (m[8],) = send(conn, "b", priority=10, correlation_id=c1)
    assert claim(conn, "b", 2) == [m[8], m[6]]
    report(conn, [m[8]], "success")                   # delivered: archived at once
    assert claim(conn, "a", 1) == [m[2]]
    # completed in place, not archived yet (as the older primitives left some)
    conn.execute("UPDATE courier.queue SET status = 'completed', completed_at = now() WHERE id = %s", (m[2],))
    return conn, m, c1


def search_ids(conn, **filters: Any) -> list[int]:
    found = messages.search(conn, **filters)
    assert all(type(s) is MessageSummary for s in found)
    return [s.id for s in found]


def test_search_filters_each_give_exactly_the_expected_ids(searchable):
    conn, m, c1 = searchable
    # In flight first, then pending by priority and FIFO, then finished but not archived.
    assert search_ids(conn) == [m[6], m[4], m[1], m[3], m[5], m[7], m[2]]
    assert search_ids(conn, limit=2) == [m[6], m[4]]
    assert search_ids(conn, endpoint="a") == [m[4], m[1], m[3], m[2]]
    assert search_ids(conn, endpoint="b") == [m[6], m[5], m[7]]
    assert search_ids(conn, endpoint="nobody") == []
    assert search_ids(conn, status="pending") == [m[4], m[1], m[3], m[5], m[7]]
    assert search_ids(conn, status="processing") == [m[6]]
    assert search_ids(conn, status="completed") == [m[2]]
    assert search_ids(conn, status="failed") == []
    assert search_ids(conn, endpoint="b", status="pending") == [m[5], m[7]]
    assert search_ids(conn, endpoint="a", status="processing") == []
    assert search_ids(conn, ordering_key="k1") == [m[1], m[3]]
    assert search_ids(conn, ordering_key="k2") == [m[6]]
    assert search_ids(conn, ordering_key="k1", status="processing") == []
    assert search_ids(conn, ordering_key="k1", endpoint="b") == []
    assert search_ids(conn, ordering_key="nokey") == []
    # A correlation id also finds the archived (delivered) message, in the order they were sent.
    assert search_ids(conn, correlation_id=c1) == [m[1], m[4], m[5], m[8]]
    assert search_ids(conn, correlation_id=c1, status="completed") == [m[8]]
    assert search_ids(conn, correlation_id=c1, endpoint="a") == [m[1], m[4]]
    assert search_ids(conn, correlation_id=c1, ordering_key="k1") == [m[1]]
    assert search_ids(conn, correlation_id=uuid.uuid4()) == []


def test_search_rows_carry_the_summary_columns(searchable):
    conn, m, c1 = searchable
    (archived,) = messages.search(conn, correlation_id=c1, status="completed")
    assert (archived.endpoint_name, archived.priority, archived.correlation_id, archived.next_retry_at) == (
        "b", 10, c1, None)
    (first,) = messages.search(conn, ordering_key="k1", limit=1)
    assert (first.id, first.endpoint_name, first.status, first.ordering_key, first.correlation_id) == (
        m[1], "a", "pending", "k1", c1)
    assert first.retry_count == 0 and first.last_error is None and isinstance(first.created_at, datetime)


def test_search_lists_ready_scheduled_and_retrying_messages_once_in_claim_order(conn):
    """Pending push messages due now and those with a time attached are in different indexes
    (see the baseline migration); a search lists both in one order, priority DESC then FIFO."""
    conn.execute("SELECT courier.create_endpoint('a', 'noop', '{}')")

    def scheduled(priority: int, at: str) -> int:
        return scalar(conn, "SELECT courier.send_with_options('a', '{}', p_priority := %s, "
                            f"p_scheduled_at := now() + interval '{at}')", (priority,))

    (ready_0,) = send(conn, "a")
    later_5 = scheduled(5, "1 day")
    (ready_5,) = send(conn, "a", priority=5)
    (retrying_5,) = send(conn, "a", priority=5)
    conn.execute("UPDATE courier.queue SET next_retry_at = now() + interval '1 hour', retry_count = 1 "
                 "WHERE id = %s", (retrying_5,))
    (ready_9,) = send(conn, "a", priority=9)
    due_0 = scheduled(0, "-1 minute")
    assert search_ids(conn, endpoint="a", status="pending") == [ready_9, later_5, ready_5, retrying_5, ready_0, due_0]
    assert search_ids(conn, endpoint="a", limit=3) == [ready_9, later_5, ready_5]
    assert search_ids(conn) == [ready_9, later_5, ready_5, retrying_5, ready_0, due_0]


def test_search_refuses_an_unknown_status(searchable):
    conn, _, _ = searchable
    with pytest.raises(InvalidInput, match="unknown message status"):
        messages.search(conn, status="redriven")


# Plans ----------------------------------------------------------------------------------

HOT_KEY = "hot"


@pytest.fixture
def deep_queue(conn, webhook):
    """130k active messages on two endpoints, with ordering keys (one of them holding 30k
    messages, all behind the rest), correlation ids, some in flight and some finished; analyzed."""
    conn.execute("SELECT courier.create_endpoint('other', 'noop', '{}')")
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("""INSERT INTO courier.queue (endpoint_id, payload, priority, ordering_key, correlation_id)
                    SELECT 1 + g % 2, jsonb_build_object('n', g), g % 11,
                           CASE WHEN g % 3 = 0 THEN 'key-' || (g % 97) END,
                           CASE WHEN g % 10 = 0 THEN md5(g::text)::uuid END
                    FROM generate_series(1, 100000) g""")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, ordering_key) "
                 "SELECT 2, '{}', %s FROM generate_series(1, 30000)", (HOT_KEY,))
    conn.execute("""UPDATE courier.queue SET status = 'processing', processing_started_at = now(), worker_id = 'w'
                    WHERE id IN (SELECT id FROM courier.queue WHERE ordering_key IS NULL ORDER BY id LIMIT 300)""")
    conn.execute("""UPDATE courier.queue SET status = 'completed', completed_at = now()
                    WHERE id IN (SELECT id FROM courier.queue WHERE status = 'pending' AND ordering_key IS NULL
                                 ORDER BY id LIMIT 200)""")
    conn.execute("ANALYZE courier.queue")
    return conn


def explain_with(conn, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    return explain_params(conn, queries.query(name), params)


def explain_params(conn, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    plan = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()[0]
    found = []

    def walk(node: dict[str, Any]) -> None:
        found.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return found


def searches_run(conn, monkeypatch, **filters: Any) -> list[tuple[str, dict[str, Any]]]:
    """The named queries messages.search() runs for these filters, with their parameters."""
    ran: list[tuple[str, dict[str, Any]]] = []
    real = queries.fetch_all

    def recording(c, name, params=None):
        ran.append((name, params))
        return real(c, name, params)

    monkeypatch.setattr(queries, "fetch_all", recording)
    try:
        messages.search(conn, **filters)
    finally:
        monkeypatch.setattr(queries, "fetch_all", real)
    return ran


def generic_plan(conn, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan a prepared statement settles on (psycopg prepares a query run five times)."""
    order = list(params)
    body = re.sub(r"%\((\w+)\)s", lambda match: f"${order.index(match[1]) + 1}", queries.query(name).rstrip(";"))
    types = {"endpoint": "text", "status": "text", "ordering_key": "text", "correlation_id": "uuid", "limit": "bigint"}
    conn.execute(f"PREPARE generic_search ({', '.join(types[p] for p in order)}) AS {body}")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        args = ", ".join("NULL" if params[p] is None else f"'{params[p]}'" for p in order)
        return explain(conn, f"EXECUTE generic_search({args})")
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("DEALLOCATE generic_search")


def test_every_search_filter_combination_is_served_by_indexes(deep_queue, monkeypatch):
    conn = deep_queue
    correlation = scalar(conn, "SELECT correlation_id FROM courier.queue WHERE correlation_id IS NOT NULL LIMIT 1")
    problems = []
    for endpoint, status, key, corr in itertools.product(
            [None, "webhook"], [None, "pending", "processing", "completed"], [None, "key-5", HOT_KEY],
            [None, correlation]):
        filters = {"endpoint": endpoint, "status": status, "ordering_key": key, "correlation_id": corr}
        ((name, params),) = searches_run(conn, monkeypatch, **filters)
        plans = {"custom": explain_with(conn, name, params), "generic": generic_plan(conn, name, params)}
        for kind, nodes in plans.items():
            on_queue = [n for n in nodes if n.get("Relation Name") == "queue"]
            if not on_queue or any(n["Node Type"] == "Seq Scan" for n in on_queue):
                problems.append((kind, filters, [(n["Node Type"], n.get("Index Name")) for n in on_queue]))
            # A key's FIFO comes from queue_ordering_idx, never from walking the primary key.
            if key and not corr and any(n.get("Index Name") == "queue_pkey" for n in on_queue):
                problems.append((kind, filters, "walks queue_pkey"))
    assert problems == []


@pytest.fixture
def deep_dlq(conn, webhook):
    """120k DLQ entries: 100k of one endpoint's, all but the oldest 1000 redriven, then 20k
    newer ones of another endpoint, a third of them redriven; analyzed."""
    conn.execute("SELECT courier.create_endpoint('other', 'noop', '{}')")
    conn.execute("""INSERT INTO courier.dlq (original_message_id, endpoint_id, endpoint_name, payload, status,
                                             original_created_at)
                    SELECT g, CASE WHEN g <= 100000 THEN 2 ELSE 1 END,
                           CASE WHEN g <= 100000 THEN 'other' ELSE 'webhook' END, '{}',
                           CASE WHEN g <= 1000 OR (g > 100000 AND g % 3 <> 0) THEN 'failed' ELSE 'redriven' END,
                           now()
                    FROM generate_series(1, 120000) g""")
    conn.execute("ANALYZE courier.dlq")
    return conn


def dlq_listing_run(conn, monkeypatch, **filters: Any) -> tuple[str, dict[str, Any]]:
    ran: list[tuple[str, dict[str, Any]]] = []
    real = queries.fetch_all
    monkeypatch.setattr(queries, "fetch_all", lambda c, name, params=None: ran.append((name, params)) or real(
        c, name, params))
    try:
        dlq.list_entries(conn, **filters)
    finally:
        monkeypatch.setattr(queries, "fetch_all", real)
    (only,) = ran
    return only


@pytest.mark.parametrize("endpoint", [None, "other", "webhook"])
@pytest.mark.parametrize("status", [None, "failed", "redriven"])
def test_dlq_listings_come_from_indexes(deep_dlq, monkeypatch, endpoint, status):
    name, params = dlq_listing_run(deep_dlq, monkeypatch, endpoint=endpoint, status=status, limit=50)
    on_dlq = [n for n in explain_params(deep_dlq, queries.query(name), params) if n.get("Relation Name") == "dlq"]
    assert on_dlq and not [n for n in on_dlq if n["Node Type"] == "Seq Scan"]
    if endpoint or status == "failed":
        # Not the primary key, filtered: 'other' has 1000 failed entries behind 119k others.
        assert {n.get("Index Name") for n in on_dlq} <= {"dlq_endpoint_idx", "dlq_failed_idx"}
    expected = [row[0] for row in deep_dlq.execute(
        "SELECT id FROM courier.dlq WHERE (%(e)s::text IS NULL OR endpoint_name = %(e)s::text) "
        "AND (%(s)s::text IS NULL OR status = %(s)s::text) ORDER BY id DESC LIMIT 50", {"e": endpoint, "s": status})]
    assert [e.id for e in dlq.list_entries(deep_dlq, endpoint, status, limit=50)] == expected


def test_dlq_summary_reads_counters_and_probes_not_every_entry(deep_dlq):
    body = scalar(deep_dlq, "SELECT prosrc FROM pg_proc WHERE proname = 'dlq_summary'")
    nodes = explain(deep_dlq, body)
    on_dlq = [n for n in nodes if n.get("Relation Name") == "dlq"]
    assert on_dlq and {n.get("Index Name") for n in on_dlq} == {"dlq_endpoint_failed_at_idx"}
    assert [(s.endpoint_name, s.failed_count, s.redriven_count) for s in dlq.summary(deep_dlq)] == [
        ("other", 1000, 99000), ("webhook", 13333, 6667)]


def test_search_lists_leased_pull_messages_after_the_pushed_ones_in_flight(searchable):
    """Pull messages under a lease have no claim time: in flight, after every pushed message in
    processing, by id (they come from their own index, queue_pull_leased_idx)."""
    conn, m, _ = searchable
    conn.execute("SELECT courier.create_endpoint('topic', 'pull', '{}')")
    pulled = [conn.execute("SELECT courier.enqueue('topic', %s::jsonb)", (f'{{"n": {i}}}',)).fetchone()[0]
              for i in range(3)]
    leased = sorted(row[0] for row in conn.execute("SELECT id FROM courier.dequeue('topic', 2)").fetchall())
    assert search_ids(conn, status="processing") == [m[6], *leased]
    assert search_ids(conn, endpoint="topic") == [*leased, pulled[2]]
    assert search_ids(conn, endpoint="topic", status="processing") == leased
    assert search_ids(conn)[:3] == [m[6], *leased]
