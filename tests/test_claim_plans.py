"""Every dequeue is served by an index, never by a scan of the queue (proved with EXPLAIN).

The claim function's own SQL body is read back from the catalog and explained with its
parameters bound, so the test follows the function as it evolves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import scalar


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain(conn, query: str) -> list[dict[str, Any]]:
    plan = scalar(conn, "EXPLAIN (FORMAT JSON) " + query)
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return list(plan_nodes(plan[0]["Plan"]))


@pytest.fixture
def busy_queue(conn, webhook):
    """50k finished rows, a few thousand pending ones, some with ordering keys; analyzed."""
    conn.execute("SELECT courier.create_endpoint('other', 'noop', '{}')")
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("""INSERT INTO courier.queue (endpoint_id, payload, status, priority, ordering_key)
                    SELECT 1, jsonb_build_object('n', g), 'completed', g % 11, NULL
                    FROM generate_series(1, 50000) g""")
    conn.execute("""INSERT INTO courier.queue (endpoint_id, payload, priority, ordering_key)
                    SELECT 1 + g % 2, jsonb_build_object('n', g), g % 11,
                           CASE WHEN g % 3 = 0 THEN 'key-' || (g % 97) END
                    FROM generate_series(1, 3000) g""")
    conn.execute("ANALYZE courier.queue")
    return conn


def claim_query(conn) -> str:
    """The query of _claim_due (a plpgsql function whose body is RETURN QUERY <query>, between the
    setting of its counter slot and flag and the flag's reset)."""
    body = scalar(conn, "SELECT prosrc FROM pg_proc WHERE proname = '_claim_due'")
    match = re.fullmatch(r".*\bBEGIN\s+RETURN QUERY\s+(.*?);\s*v_set := [^;]*;\s*END\s*", body, re.DOTALL)
    assert match, body
    return match[1]


def claim_body(conn, worker: str, batch: int, endpoint: str) -> str:
    body = claim_query(conn)
    return (body.replace("p_worker_id", f"'{worker}'").replace("p_batch_size", str(batch))
            .replace("p_endpoint_id", endpoint).replace("v_writes", "0"))


@pytest.mark.parametrize("endpoint", ["1", "NULL"])
def test_claim_never_scans_the_queue(busy_queue, endpoint):
    nodes = explain(busy_queue, claim_body(busy_queue, "w", 100, endpoint))
    queue_scans = [n for n in nodes if n.get("Relation Name") == "queue"]
    assert queue_scans, "the plan should touch the queue"
    assert [n["Node Type"] for n in queue_scans if n["Node Type"] == "Seq Scan"] == []
    assert {n.get("Index Name") for n in queue_scans} >= {"queue_ready_idx", "queue_due_idx"}


def test_ordering_key_checks_use_indexes(busy_queue):
    busy_queue.execute("SELECT count(*) FROM courier._claim_due('w', 200, 1)")  # some keys in flight
    busy_queue.execute("ANALYZE courier.queue")
    nodes = explain(busy_queue, claim_body(busy_queue, "w", 100, "1"))
    on_queue = [n for n in nodes if n.get("Relation Name") == "queue" and "Scan" in n["Node Type"]]
    assert on_queue and all(n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Tid Scan")
                        for n in on_queue)
    assert "queue_ordering_idx" in {n.get("Index Name") for n in nodes}


def test_claim_cost_stays_flat_after_many_finished_rows(busy_queue):
    """Finished rows are outside every partial index the claim uses."""
    before = busy_queue.execute("SELECT count(*) FROM courier._claim_due('w', 50, 1)").fetchone()[0]
    busy_queue.execute("UPDATE courier.queue SET status = 'completed' WHERE status = 'processing'")
    nodes = explain(busy_queue, claim_body(busy_queue, "w", 50, "1"))
    assert before == 50
    assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "queue" for n in nodes)


def generic_claim_plan(conn, body: str) -> list[dict[str, Any]]:
    """The plan a function gets: parameters unknown to the planner, as in a generic plan."""
    parameterised = (body.replace("p_worker_id", "$1").replace("p_batch_size", "$2").replace("p_endpoint_id", "$3")
                     .replace("v_writes", "$4"))
    conn.execute(f"PREPARE generic_claim (text, integer, integer, integer) AS {parameterised}")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        return explain(conn, "EXECUTE generic_claim('w', 100, 1, 0)")
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("DEALLOCATE generic_claim")


@pytest.fixture
def deep_queue(conn, webhook):
    """100k pending messages, analyzed."""
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, priority) "
                 "SELECT 1, jsonb_build_object('n', g), g % 11 FROM generate_series(1, 100000) g")
    conn.execute("ANALYZE courier.queue")
    return conn


def test_the_claims_update_finds_its_rows_by_ctid_even_with_a_generic_plan(deep_queue):
    """The planner cannot see how few rows LIMIT p_batch_size leaves; the UPDATE must not
    join the candidates to the queue by a scan of it (it did: 24 ms at 100k pending)."""
    nodes = generic_claim_plan(deep_queue, claim_query(deep_queue))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "queue"]
    assert "Tid Scan" in {n["Node Type"] for n in nodes if n.get("Relation Name") == "queue"}


def ready_claim_query(conn) -> str:
    """The query of _claim_ready, the claim of an endpoint with only ready, unkeyed messages."""
    body = scalar(conn, "SELECT prosrc FROM pg_proc WHERE proname = '_claim_ready'")
    match = re.fullmatch(r".*\bBEGIN\s+RETURN QUERY\s+(.*?);\s*v_set := [^;]*;\s*END\s*", body, re.DOTALL)
    assert match, body
    return match[1]


def test_the_ready_claim_reads_one_range_of_its_index_and_finds_its_rows_by_ctid(deep_queue):
    """With its generic plan (the one plpgsql keeps) the lean claim reads the head of
    queue_ready_idx, never a priority level of queue_due_idx, and updates what it locked by TID:
    no scan of the queue, no descent of the primary key per row."""
    nodes = generic_claim_plan(deep_queue, ready_claim_query(deep_queue))
    on_queue = [n for n in nodes if n.get("Relation Name") == "queue" and "Scan" in n["Node Type"]]
    assert sorted((n["Node Type"], n.get("Index Name")) for n in on_queue) == [
        ("Index Scan", "queue_ready_idx"), ("Tid Scan", None)], on_queue
    claimed = deep_queue.execute("SELECT id, priority FROM courier._claim_ready('w', 50, 1)").fetchall()
    assert claimed == sorted(claimed, key=lambda row: (-row[1], row[0])) and len(claimed) == 50
    assert {row[1] for row in claimed} == {10}  # the highest priority first, in id order


def test_claim_batch_asks_the_claim_indexes_whether_anything_is_pending_before_it_claims(busy_queue):
    """claim_batch runs _claim_due only where the endpoint has pending messages, asked of the heads of
    queue_ready_idx and queue_pending_rest_idx, with the generic plan plpgsql keeps."""
    busy_queue.execute("""INSERT INTO courier.queue (endpoint_id, payload, scheduled_at)
                          SELECT 1, '{}', now() + interval '1 day' FROM generate_series(1, 20000)""")
    busy_queue.execute("ANALYZE courier.queue")
    body = scalar(busy_queue, "SELECT prosrc FROM pg_proc WHERE proname = 'claim_batch'")
    probes = re.findall(r"\((SELECT q\.id FROM courier\.queue q .*?LIMIT 1)\) IS NOT NULL", body, re.DOTALL)
    assert len(probes) == 2, body
    used = set()
    for probe in probes:
        nodes = generic_claim_plan(busy_queue, probe.replace("p_endpoint_id", "$3"))
        on_queue = [n for n in nodes if n.get("Relation Name") == "queue"]
        assert on_queue and all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in on_queue), on_queue
        used |= {n["Index Name"] for n in on_queue}
    assert used == {"queue_ready_idx", "queue_pending_rest_idx"}


def test_a_worker_planned_against_an_empty_queue_still_reads_the_queue_by_its_indexes(conn, webhook):
    """A drained queue, analyzed while empty, would plan the claim's probes and the report's
    delete as sequential scans that the connection then keeps however deep the queue grows."""
    conn.execute("VACUUM ANALYZE courier.queue")
    endpoint = scalar(conn, "SELECT id FROM courier.endpoints LIMIT 1")

    def report_and_claim(held: list[tuple]) -> list[tuple]:
        return conn.execute(
            "SELECT c.id, c.lease FROM courier.report_and_claim('w', 10, %s, %s::bigint[], %s::integer[], "
            "%s::text[], %s::text[]) c WHERE c.id IS NOT NULL",
            (endpoint, [i for i, _ in held], [lease for _, lease in held], ["success"] * len(held),
             [None] * len(held))).fetchall()

    name = scalar(conn, "SELECT name FROM courier.endpoints WHERE id = %s", (endpoint,))
    held: list[tuple] = []
    for _ in range(6):  # past plpgsql's custom plans, into the ones it keeps
        conn.execute("SELECT courier.send_with_options(%s, '{}')", (name,))
        held = report_and_claim(held)
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, status, processing_started_at, worker_id) "
                 "SELECT %s, '{}', 'processing', now(), 'x' FROM generate_series(1, 2000)", (endpoint,))
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload) SELECT %s, '{}' FROM generate_series(1, 20)",
                 (endpoint,))
    for _ in range(2):  # what this connection's earlier statements counted, out of the way
        conn.execute("SELECT pg_stat_force_next_flush()")
    with conn.transaction():
        assert len(report_and_claim(held)) == 10
        scans = scalar(conn, "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'courier.queue'::regclass")
    assert scans == 0


def test_a_report_with_failures_planned_against_an_empty_queue_reads_only_its_rows(conn, webhook):
    """report_outcomes's general path keeps one plan a session, as the all-success path does: made
    against a queue analyzed while empty, it still finds the report's rows by id, never reading
    the 2,000 other claims in processing beside them (by a scan or an index range)."""
    conn.execute("VACUUM ANALYZE courier.queue")
    endpoint = scalar(conn, "SELECT id FROM courier.endpoints LIMIT 1")
    name = scalar(conn, "SELECT name FROM courier.endpoints WHERE id = %s", (endpoint,))

    def send_claim_and_report(count: int) -> tuple:
        for _ in range(count):
            conn.execute("SELECT courier.send_with_options(%s, '{}')", (name,))
        held = conn.execute("SELECT c.id, c.lease FROM courier.claim_batch('w', %s, %s) c",
                            (count, endpoint)).fetchall()
        outcomes = ["success", "retryable"] * (len(held) // 2)
        return conn.execute("SELECT delivered, retried FROM courier.report_outcomes(%s, %s, %s, %s)",
                            ([i for i, _ in held], [lease for _, lease in held], outcomes,
                             [None if o == "success" else "HTTP 503" for o in outcomes])).fetchone()

    for _ in range(6):  # past plpgsql's first plans, into the ones it keeps
        assert send_claim_and_report(2) == (1, 1)
        conn.execute("UPDATE courier.queue SET next_retry_at = NULL WHERE status = 'pending'")
    conn.execute("DELETE FROM courier.queue")
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, status, processing_started_at, worker_id) "
                 "SELECT %s, '{}', 'processing', now(), 'x' FROM generate_series(1, 2000)", (endpoint,))
    for _ in range(2):  # what this connection's earlier statements counted, out of the way
        conn.execute("SELECT pg_stat_force_next_flush()")
    with conn.transaction():
        assert send_claim_and_report(10) == (5, 5)
        scans, read = conn.execute("SELECT seq_scan, idx_tup_fetch FROM pg_stat_xact_user_tables "
                                   "WHERE relid = 'courier.queue'::regclass").fetchone()
    assert scans == 0 and read < 200


def test_worker_functions_never_jit(conn):
    """JIT-compiling a 3 ms claim cost 30 ms on a server with JIT on (the default with LLVM)."""
    configs = dict(conn.execute("SELECT proname, proconfig FROM pg_proc WHERE proname IN "
                                "('_claim_due', 'claim_batch', 'report_outcomes', "
                                "'archive_completed_messages')").fetchall())
    assert len(configs) == 4 and all("jit=off" in (config or []) for config in configs.values()), configs


def test_functions_that_force_index_scans_never_jit(conn):
    """enable_seqscan = off prices a sequential scan left in a plan (of a one-row table such as
    send_limits) at 1e10, far past jit_above_cost: such a statement is JIT-compiled, with inlining
    and optimization, on every run. On PostgreSQL 15 with LLVM the leader's move of the send stage
    took 458 ms a second that way. Each such function turns JIT off itself, or is called only by
    functions that do."""
    functions = {name: (config or [], source) for name, config, source in conn.execute(
        "SELECT proname, proconfig, prosrc FROM pg_proc WHERE pronamespace = 'courier'::regnamespace").fetchall()}

    def jit_off(name: str) -> bool:
        return "jit=off" in functions[name][0]

    forcing = [name for name, (config, _) in functions.items() if "enable_seqscan=off" in config]
    assert "_move_staged" in forcing and "claim_batch" in forcing
    for name in forcing:
        if not jit_off(name):
            callers = [caller for caller, (_, source) in functions.items()
                       if caller != name and re.search(rf"\b{name}\s*\(", source)]
            assert callers and all(jit_off(caller) for caller in callers), (name, callers)


def test_a_claim_never_reads_messages_scheduled_for_later(conn, webhook):
    """200k messages scheduled for tomorrow ahead of the due ones: the claim reads the due
    ones from indexes and filters none of the future ones (it filtered all 200k, 51 ms); the
    due ones come one range of queue_due_idx per priority level used, each stopping at now()."""
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, scheduled_at) "
                 "SELECT 1, jsonb_build_object('n', g), now() + interval '1 day' FROM generate_series(1, 200000) g")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload) SELECT 1, '{}' FROM generate_series(1, 30)")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, next_retry_at) "
                 "SELECT 1, '{}', now() - interval '1 second' FROM generate_series(1, 20)")
    conn.execute("ANALYZE courier.queue")
    body = claim_body(conn, "w", 100, "1")
    with conn.transaction(force_rollback=True):
        plan = scalar(conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + body)
    nodes = list(plan_nodes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]))
    scans = [n for n in nodes if n.get("Relation Name") == "queue" and "Scan" in n["Node Type"]
             and n.get("Actual Loops", 0) > 0]
    assert {n.get("Index Name") for n in scans} >= {"queue_ready_idx", "queue_due_idx"}
    assert sum(n.get("Rows Removed by Filter", 0) for n in nodes if n.get("Relation Name") == "queue") == 0
    [ready] = [n for n in scans if n.get("Index Name") == "queue_ready_idx"]
    [due] = [n for n in scans if n.get("Index Name") == "queue_due_idx"]
    assert ready["Actual Rows"] == 30
    # One range per priority level the endpoint has used (only 0 here, of eleven), up to now.
    assert due["Actual Loops"] == 1 and "now()" in due["Index Cond"]
    assert conn.execute("SELECT count(*) FROM courier.claim_batch('w', 100, 1)").fetchone()[0] == 50


def test_pull_messages_stay_out_of_the_push_claim_indexes(conn, webhook):
    """queue_ready_idx and queue_due_idx hold push messages only: enqueues and nacks of a
    pull topic add nothing to them, and a claim across every endpoint never takes a pull message.
    That the claims still read both indexes, the tests above show on their larger queues."""
    conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
    conn.execute("SELECT courier.create_endpoint('topic', 'pull', '{}')")
    conn.execute("SELECT courier.enqueue('topic', jsonb_build_object('n', g)) FROM generate_series(1, 300) g")
    conn.execute("SELECT courier.enqueue('topic', '{}', p_scheduled_at => now() - interval '1 minute') "
                 "FROM generate_series(1, 200) g")
    taken = conn.execute("SELECT array_agg(id), array_agg(lease) FROM courier.dequeue('topic', 50, 60)").fetchone()
    conn.execute("SELECT * FROM courier.nack(%s, %s, 'again')", taken)
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload) SELECT 1, '{}' FROM generate_series(1, 30)")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, next_retry_at) "
                 "SELECT 1, '{}', now() - interval '1 second' FROM generate_series(1, 20)")
    conn.execute("VACUUM ANALYZE courier.queue")  # sets each index's reltuples to its exact entry count
    entries = dict(conn.execute("SELECT relname, reltuples::bigint FROM pg_class "
                                "WHERE relname IN ('queue_ready_idx', 'queue_due_idx')").fetchall())
    assert entries == {"queue_ready_idx": 30, "queue_due_idx": 20}

    claimed = conn.execute("SELECT endpoint_id, count(*) FROM courier._claim_due('w', 1000) GROUP BY 1").fetchall()
    assert claimed == [(1, 50)]
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE visible_at IS NOT NULL AND status = 'pending'") == 500
