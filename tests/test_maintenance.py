"""The maintenance leader with real worker processes: one leader at a time, failover after
kill -9, and the jobs it runs; plus the event log, health_check() and get_worker_status()."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time

import pytest

from console.workers.maintenance import MaintenanceJob, MaintenanceLeader, MaintenanceSchedule
from tests.helpers import archived, report, scalar
from tests.workers import start_worker_process, wait_for


def leaders(conn) -> list[str]:
    return [w for (w,) in conn.execute(
        "SELECT worker_id FROM courier.get_worker_status() WHERE alive AND maintenance_leader")]


def alive(conn) -> int:
    return scalar(conn, "SELECT count(*) FROM courier.get_worker_status() WHERE alive")


def stop(process) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()


def test_one_leader_and_failover_after_kill_9(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    workers = {name: start_worker_process(dsn, "--worker-id", name) for name in ("first", "second")}
    try:
        wait_for(lambda: alive(conn) == 2 and len(leaders(conn)) == 1, timeout=30)
        (leader,) = leaders(conn)
        (follower,) = set(workers) - {leader}
        # A claim the leader holds, stale already: after the kill, the new leader's first job
        # (start-up recovery) must put it back in line. (The old leader would only get to it
        # in its next periodic run, a minute after its election.)
        message = scalar(conn, "INSERT INTO courier.queue (endpoint_id, payload, status, worker_id, "
                               "processing_started_at) VALUES (1, '{\"stranded\": true}', 'processing', %s, "
                               "now() - interval '10 minutes') RETURNING id", (leader,))
        workers[leader].kill()  # SIGKILL: its session ends, and the server drops its lock
        workers[leader].wait(10)

        wait_for(lambda: leaders(conn) == [follower], timeout=15)
        wait_for(lambda: archived(conn) == 1, timeout=15)
        assert scalar(conn, "SELECT retry_count FROM courier.archive WHERE id = %s", (message,)) == 1
        elected = [row[0] for row in conn.execute(
            "SELECT details ->> 'worker_id' FROM courier.event_log "
            "WHERE event_type = 'maintenance.leader_elected' ORDER BY id")]
        assert elected == [leader, follower]
        assert scalar(conn, "SELECT count(*) FROM courier.event_log WHERE event_type = 'messages.stale_recovered'") == 1
    finally:
        for process in workers.values():
            if process.poll() is None:
                stop(process)


def test_the_leader_runs_expiry_and_archiving(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('paused', 'noop', '{}')")
    conn.execute("SELECT courier.disable_endpoint('paused')")  # nothing gets delivered meanwhile
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, expires_at) "
                 "SELECT 1, jsonb_build_object('n', g), now() - interval '1 second' FROM generate_series(1, 30) g")
    worker = start_worker_process(dsn)
    try:
        wait_for(lambda: archived(conn, "expired") == 30, timeout=30)
    finally:
        assert stop(worker) == 0
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    counted = scalar(conn, "SELECT metric_value FROM courier.metrics() WHERE metric_name = 'messages_expired_total'")
    assert counted == 30


def test_a_graceful_stop_hands_leadership_on_at_once(dsn, conn):
    first = start_worker_process(dsn, "--worker-id", "first")
    try:
        wait_for(lambda: leaders(conn) == ["first"], timeout=30)
        second = start_worker_process(dsn, "--worker-id", "second")
        try:
            wait_for(lambda: alive(conn) == 2, timeout=30)
            assert leaders(conn) == ["first"]
            assert stop(first) == 0
            wait_for(lambda: leaders(conn) == ["second"], timeout=15)
        finally:
            assert stop(second) == 0
    finally:
        if first.poll() is None:
            first.kill()


# The event log ------------------------------------------------------------------------------

def test_the_event_log_records_each_kind_of_event(conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.alter_endpoint('hook', '{\"concurrency\": 4}'::jsonb)")
    conn.execute("SELECT courier.disable_endpoint('hook')")
    conn.execute("SELECT courier.enable_endpoint('hook')")
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '1')")
    ids = scalar(conn, "SELECT courier.send_batch('hook', ARRAY['{}'::jsonb, '{}'])")
    conn.execute("SELECT courier.claim_batch('w', 1, 1)")
    report(conn, ids[:1], ["retryable"], ["boom"])  # opens
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    conn.execute("UPDATE courier.queue SET next_retry_at = NULL")
    probe = [row[0] for row in conn.execute("SELECT id FROM courier.claim_batch('w', 5, 1)")]  # half_open
    report(conn, probe, ["permanent"], ["[PERMANENT] 400"])
    conn.execute("SELECT courier.reset_circuit_breaker('hook')")
    dlq_id = scalar(conn, "SELECT id FROM courier.dlq")
    conn.execute("SELECT courier.redrive_message(%s)", (dlq_id,))
    conn.execute("SELECT courier.replay_message(%s)", (probe[0],))
    conn.execute("SELECT courier.replay_range(1, now() - interval '1 hour', now() + interval '1 hour')")
    conn.execute("SELECT courier.maintain_archive_partitions(5)")  # the install made this month's and 3 more
    conn.execute("INSERT INTO courier.event_log (event_type, created_at) "
                 "VALUES ('ancient', now() - interval '400 days')")
    assert scalar(conn, "SELECT courier.cleanup_event_log()") == 1
    conn.execute("SELECT courier.drop_endpoint('hook', true)")

    kinds = {kind for (kind,) in conn.execute("SELECT DISTINCT event_type FROM courier.event_log")}
    assert {"endpoint.created", "endpoint.altered", "endpoint.disabled", "endpoint.enabled", "endpoint.dropped",
            "config.changed", "circuit.opened", "circuit.half_open", "circuit.reset", "dlq.redrive",
            "archive.replay_message", "archive.replay_started", "archive.replay_finished",
            "archive.partitions_created", "event_log.cleanup"} <= kinds
    assert "ancient" not in kinds


def drop_this_months_partition(conn) -> None:
    conn.execute(f"DROP TABLE courier.{scalar(conn, 'SELECT courier._archive_partition_name(now())')}")


@pytest.mark.parametrize(("setup", "check", "status"), [
    ("SELECT courier.set_setting('max_queue_size', '10');"
     "SELECT courier.send_batch('hook', ARRAY(SELECT '{}'::jsonb FROM generate_series(1, 9)))",
     "backpressure", "warning"),
    ("SELECT courier.send('hook', '{}')", "workers", "critical"),
    ("UPDATE courier.endpoints SET circuit_state = 'open'", "circuits", "warning"),
    (drop_this_months_partition, "archive_partitions", "critical"),
    ("SELECT courier.create_schedule('nightly', '0 3 * * *', 'hook');"
     "UPDATE courier.schedules SET next_run_at = now() - interval '5 minutes'", "schedules", "warning"),
])
def test_health_check_flags_what_an_operator_must_act_on(conn, setup, check, status):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    if callable(setup):
        setup(conn)
    else:
        conn.execute(setup)
    found = {name: state for name, state, _, _ in conn.execute("SELECT * FROM courier.health_check()")}
    assert found[check] == status
    # Nothing else is flagged ('workers' is always at least a warning here: none run).
    assert {name for name, state in found.items() if state != "ok"} - {"workers"} <= {check}


def test_long_gone_workers_are_pruned(conn):
    conn.execute("SELECT courier.worker_heartbeat('gone', 'h', 1, 1, 0, 0, 0, 'stopped')")
    conn.execute("SELECT courier.worker_heartbeat('here', 'h', 2, 1, 0, 0, 0, 'running')")
    conn.execute("UPDATE courier.workers SET last_heartbeat = now() - interval '2 hours' WHERE worker_id = 'gone'")
    assert scalar(conn, "SELECT courier.prune_workers()") == 1
    assert [w for (w,) in conn.execute("SELECT worker_id FROM courier.workers")] == ["here"]


class _WithSlowJob(MaintenanceSchedule):
    """The leader's jobs with one that takes seconds, as a VACUUM of a busy queue does."""

    def jobs(self) -> list[MaintenanceJob]:
        return [*super().jobs(), MaintenanceJob("slow", "", 1.0, runner=lambda dsn, budget: time.sleep(4) or 0)]


def test_the_sends_estimate_and_stage_stay_fresh_while_a_job_takes_seconds(dsn, conn):
    """Every send reads the leader's estimate (room_until lapses two seconds after it) and the
    stage's lease: a slow job must not hold them up, or sends fall to the exact path."""
    leader = MaintenanceLeader(dsn, "leader-test", _WithSlowJob())
    seen: list[tuple] = []

    async def lead_and_watch() -> None:
        stopping = asyncio.Event()
        running = asyncio.create_task(leader.run(stopping))
        for _ in range(60):  # 6 s: the slow job's first run and part of its second
            seen.append(conn.execute("SELECT estimated_at, room_until > clock_timestamp(), "
                                     "stage_until > clock_timestamp() FROM courier.send_limits").fetchone())
            await asyncio.sleep(0.1)
        stopping.set()
        await running

    asyncio.run(lead_and_watch())
    estimates = sorted({estimated_at for estimated_at, _, _ in seen if estimated_at is not None})
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(estimates)]
    assert len(estimates) >= 4 and max(gaps) < 1.8, gaps
    settled = seen[20:]  # after the first round's start
    assert all(room and staging for _, room, staging in settled)
