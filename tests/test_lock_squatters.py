"""Issue 23, item 12: a database user holding the keys Courier used to lock on (advisory locks,
which any role can take) stops neither maintenance nor sends; leadership is a lease only
Courier's owner writes, never held by two at once, and health_check() calls a cluster whose
maintenance has stopped critical."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from sqlkit import migrate
from tests import test_roles_and_psql
from tests.helpers import archived, claim, report, scalar
from tests.test_cli import run
from tests.test_maintenance import leaders, stop
from tests.workers import start_worker_process, wait_for

login_as = test_roles_and_psql.login_as

MAINTENANCE_KEY = "1668248946, 2"  # the advisory key leadership used to be


def health(conn, check: str) -> tuple[str, str]:
    return conn.execute("SELECT status, detail FROM courier.health_check() WHERE check_name = %s",
                        (check,)).fetchone()


def test_an_application_holding_the_old_maintenance_key_stops_no_maintenance(dsn, conn, login_as):
    app = login_as("courier_application")
    assert scalar(app, f"SELECT pg_try_advisory_lock({MAINTENANCE_KEY})")
    for statement in ("SELECT * FROM courier.maintenance_lease FOR UPDATE",
                      "UPDATE courier.maintenance_lease SET expires_at = 'infinity'",
                      "SELECT courier.try_lead_maintenance('squatter')"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute(statement)

    conn.execute("SELECT courier.create_endpoint('paused', 'noop', '{}')")
    conn.execute("SELECT courier.disable_endpoint('paused')")
    conn.execute("INSERT INTO courier.queue (endpoint_id, payload, expires_at) "
                 "SELECT 1, '{}', now() - interval '1 second' FROM generate_series(1, 5)")
    worker = start_worker_process(dsn, "--worker-id", "honest")
    try:
        wait_for(lambda: leaders(conn) == ["honest"], timeout=30)
        wait_for(lambda: archived(conn, "expired") == 5, timeout=30)  # expiry and archiving ran
        assert health(conn, "maintenance_leader")[0] == "ok"
    finally:
        assert stop(worker) == 0


def test_an_application_holding_the_endpoint_and_commit_keys_blocks_no_send(conn, login_as):
    endpoint = scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")
    squatter = login_as("courier_application")
    for key in ("hashtext('courier.endpoint'), hashtext('hook')",
                f"hashtext('courier.sends_committing'), {endpoint}",
                f"hashtext('courier_cb'), {endpoint}"):
        assert scalar(squatter, f"SELECT pg_try_advisory_lock({key})")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        squatter.execute("SELECT 1 FROM courier.endpoints FOR KEY SHARE")

    app = login_as("courier_application")
    app.execute("SET statement_timeout = '10s'")
    assert scalar(app, "SELECT courier.send('hook', '{\"n\": 1}')") > 0
    assert scalar(app, "SELECT courier.send_batch('hook', ARRAY['{}'::jsonb, '{}'])") is not None
    # A worker's failure report updates the circuit breaker, which locked courier_cb.
    conn.execute("SET statement_timeout = '10s'")
    claimed = [row[0] for row in claim(conn, 3)]
    report(conn, claimed, ["retryable"] * 3, ["boom"] * 3)
    assert scalar(conn, "SELECT circuit_failure_count FROM courier.endpoints WHERE id = %s", (endpoint,)) == 3
    assert scalar(conn, "SELECT courier.reset_circuit_breaker('hook')")
    # Counter compaction and archive partitions, run by the leader, locked on keys too.
    for key in ("hashtext('courier.compact_queue_depth')", "hashtext('courier.archive_partitions')"):
        assert scalar(squatter, f"SELECT pg_try_advisory_lock({key})")
    conn.execute("SELECT courier.compact_queue_depth()")
    drop_this = scalar(conn, "SELECT courier._archive_partition_name(now() + interval '1 month')")
    conn.execute(f"DROP TABLE IF EXISTS courier.{drop_this}")
    conn.execute("SELECT courier.maintain_archive_partitions(2)")
    assert scalar(conn, "SELECT to_regclass(%s) IS NOT NULL", (f"courier.{drop_this}",))


def test_two_candidates_never_both_lead_and_a_lease_passes_on(dsn, conn):
    candidates = [psycopg.connect(dsn, autocommit=True) for _ in range(8)]
    try:
        barrier = threading.Barrier(len(candidates))
        won: list[bool] = [False] * len(candidates)

        def campaign(i: int) -> None:
            barrier.wait()
            won[i] = bool(scalar(candidates[i], "SELECT courier.try_lead_maintenance(%s)", (f"w{i}",)))

        threads = [threading.Thread(target=campaign, args=(i,)) for i in range(len(candidates))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert won.count(True) == 1
        leader = won.index(True)
        assert scalar(candidates[leader], "SELECT courier.try_lead_maintenance(%s)", (f"w{leader}",))  # renews
        others = [i for i in range(len(candidates)) if i != leader]
        assert not any(scalar(candidates[i], "SELECT courier.try_lead_maintenance(%s)", (f"w{i}",))
                       for i in others)

        # A hung leader (its session alive, its lease run out) loses the lease, and learns so.
        conn.execute("UPDATE courier.maintenance_lease SET expires_at = now() - interval '1 second'")
        successor = others[0]
        assert scalar(candidates[successor], "SELECT courier.try_lead_maintenance(%s)", (f"w{successor}",))
        assert not scalar(candidates[leader], "SELECT courier.try_lead_maintenance(%s)", (f"w{leader}",))

        # A leader whose session ends frees the lease at once.
        candidates[successor].close()
        wait_for(lambda: scalar(candidates[others[1]], "SELECT courier.try_lead_maintenance(%s)",
                                (f"w{others[1]}",)), timeout=10)
        assert [e for (e,) in conn.execute("SELECT details ->> 'worker_id' FROM courier.event_log "
                                           "WHERE event_type = 'maintenance.leader_elected' ORDER BY id")] \
            == [f"w{leader}", f"w{successor}", f"w{others[1]}"]
    finally:
        for candidate in candidates:
            candidate.close()


def test_health_check_is_critical_when_live_workers_run_no_maintenance(conn):
    conn.execute("INSERT INTO courier.workers (worker_id, hostname, pid, concurrency, started_at, last_heartbeat) "
                 "VALUES ('w', 'h', 1, 1, now() - interval '10 minutes', now())")
    status, detail = health(conn, "maintenance_leader")
    assert status == "critical" and "never run" in detail
    # A leader elected, then silent past its lease (hung, or its jobs stuck): critical again.
    assert scalar(conn, "SELECT courier.try_lead_maintenance('w')")
    assert health(conn, "maintenance_leader")[0] == "ok"
    assert scalar(conn, "SELECT maintenance_leader FROM courier.get_worker_status()")
    conn.execute("UPDATE courier.maintenance_lease SET maintained_at = now() - interval '5 minutes', "
                 "expires_at = now() - interval '4 minutes'")
    status, detail = health(conn, "maintenance_leader")
    assert status == "critical" and "none leads" in detail and "300 s ago" in detail
    assert not scalar(conn, "SELECT maintenance_leader FROM courier.get_worker_status()")


def test_a_session_holding_an_endpoints_send_key_cannot_hang_its_drop(conn, login_as):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    squatter = login_as("courier_application")
    assert scalar(squatter, "SELECT pg_try_advisory_lock_shared(hashtext('courier.endpoint'), hashtext('hook'))")
    pid = scalar(squatter, "SELECT pg_backend_pid()")
    started = time.monotonic()
    with pytest.raises(psycopg.errors.LockNotAvailable, match=f"held by session\\(s\\) {pid}"):
        conn.execute("SELECT courier.drop_endpoint('hook')")
    assert time.monotonic() - started < 30
    squatter.execute("SELECT pg_advisory_unlock_all()")
    assert scalar(conn, "SELECT courier.drop_endpoint('hook')")


def test_a_long_job_on_a_connection_of_its_own_keeps_renewing_the_lease(dsn, conn, monkeypatch):
    import asyncio

    from console.workers import maintenance

    monkeypatch.setattr(maintenance, "LEASE_RENEWAL_DURING_JOBS", 0.2, raising=False)
    renewed_meanwhile: list[object] = []

    def long_job(_dsn: str, _budget: float) -> int:  # a VACUUM of a big queue, say
        first = scalar(conn, "SELECT maintained_at FROM courier.maintenance_lease")
        time.sleep(1.5)
        renewed_meanwhile.append(scalar(conn, "SELECT maintained_at > %s FROM courier.maintenance_lease", (first,)))
        return 0

    leader = maintenance.MaintenanceLeader(dsn, "long")
    leader._jobs = [maintenance.MaintenanceJob("long", "", 3600, runner=long_job)]

    async def main() -> None:
        stopping = asyncio.Event()
        task = asyncio.create_task(leader.run(stopping))
        deadline = time.monotonic() + 30
        while not renewed_meanwhile and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        stopping.set()
        await task

    asyncio.run(main())
    assert renewed_meanwhile == [True]


def test_a_session_holding_the_migration_key_cannot_hang_migrate(dsn, conn, login_as):
    squatter = login_as("courier_application")
    squatter.execute("SET application_name = 'squatter'")
    assert scalar(squatter, "SELECT pg_try_advisory_lock(%s)", (migrate.MIGRATION_LOCK_KEY,))
    started = time.monotonic()
    assert migrate.migrate(dsn) == []  # up to date: a starting console or demo takes no lock
    assert time.monotonic() - started < 5

    conn.execute("UPDATE courier.schema_functions SET checksum = 'stale' WHERE area = 'observability'")
    refused = run("migrate", "--lock-wait", "1", dsn=dsn)
    assert refused.code == 1 and "Traceback" not in refused.err
    pid, role = squatter.execute("SELECT pg_backend_pid(), current_user").fetchone()
    assert f"migration lock is held by session {pid} (role {role}, application 'squatter'" in refused.err
    assert scalar(conn, "SELECT checksum FROM courier.schema_functions WHERE area = 'observability'") == "stale"

    squatter.close()
    assert run("migrate", "--lock-wait", "5", dsn=dsn).code == 0
    assert scalar(conn, "SELECT checksum FROM courier.schema_functions WHERE area = 'observability'") != "stale"
