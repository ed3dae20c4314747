"""Fenced claims and the delivery-correctness fixes of issue 10, at the SQL level: leases on
every claim, stale recovery that counts attempts, ordering keys per endpoint, full redrive."""

from __future__ import annotations

import time

import pytest

from tests import test_roles_and_psql
from tests.helpers import message_status, scalar

login_as = test_roles_and_psql.login_as  # the fixture: logs in as a new member of a role


@pytest.fixture
def hook(conn) -> int:
    return scalar(conn, "SELECT courier.create_endpoint('hook', 'noop', '{}')")


def send(conn, payload: str = "{}", endpoint: str = "hook", key: str | None = None) -> int:
    return scalar(conn, "SELECT courier.send_with_options(%s, %s::jsonb, p_ordering_key := %s)",
                  (endpoint, payload, key))


def claim(conn, endpoint: int, worker: str, batch: int = 10) -> list[tuple[int, int]]:
    """(id, lease) of each message claimed."""
    return [tuple(row) for row in conn.execute("SELECT id, lease FROM courier.claim_batch(%s, %s, %s)",
                                               (worker, batch, endpoint))]


def report(conn, held: list[tuple[int, int]], outcome: str = "success") -> tuple:
    return conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, %s, %s)",
                        ([i for i, _ in held], [lease for _, lease in held], [outcome] * len(held),
                         [None if outcome == "success" else "[RETRYABLE] HTTP 503"] * len(held))).fetchone()


def go_stale(conn) -> None:
    conn.execute("UPDATE courier.queue SET processing_started_at = now() - interval '1 hour' "
                 "WHERE status = 'processing'")


def stale_reports_total(conn) -> float:
    return scalar(conn, "SELECT metric_value FROM courier.metrics() WHERE metric_name = 'stale_reports_total'")


# 1. Fenced claims ---------------------------------------------------------------------


@pytest.mark.parametrize("late", ["success", "retryable", "permanent"])
def test_a_late_report_never_touches_the_claim_of_the_next_worker(conn, hook, late):
    message = send(conn)
    (first,) = claim(conn, hook, "slow-worker")
    go_stale(conn)
    assert scalar(conn, "SELECT courier.recover_stale_messages()") == 1
    (second,) = claim(conn, hook, "next-worker")
    assert second[1] not in (0, first[1])  # a new lease, drawn at random

    assert report(conn, [first], late) == (0, 0, 0, 1)  # the slow worker's report: a no-op
    row = conn.execute("SELECT status, worker_id, lease FROM courier.queue WHERE id = %s", (message,)).fetchone()
    assert row == ("processing", "next-worker", second[1])
    assert stale_reports_total(conn) == 1
    event = conn.execute("SELECT details FROM courier.event_log WHERE event_type = 'report.stale_lease'").fetchone()
    assert event[0]["count"] == 1 and event[0]["message_ids"] == [message]

    assert report(conn, [second]) == (1, 0, 0, 0)  # the holder's report applies
    assert message_status(conn, message) == "completed"


def test_a_late_release_never_touches_the_claim_of_the_next_worker(conn, hook):
    message = send(conn)
    (first,) = claim(conn, hook, "slow-worker")
    go_stale(conn)
    conn.execute("SELECT courier.recover_stale_messages()")
    claim(conn, hook, "next-worker")
    assert scalar(conn, "SELECT courier.release_batch(%s, %s)", ([first[0]], [first[1]])) == 0
    assert message_status(conn, message) == "processing"
    assert stale_reports_total(conn) == 1


def test_one_stale_report_in_a_batch_leaves_the_others_applied(conn, hook):
    stale_one, fresh_one = send(conn), send(conn)
    held = dict(claim(conn, hook, "w"))
    conn.execute("UPDATE courier.queue SET lease = lease + 1 WHERE id = %s", (stale_one,))  # taken back
    assert report(conn, [(stale_one, held[stale_one]), (fresh_one, held[fresh_one])]) == (1, 0, 0, 1)
    assert message_status(conn, fresh_one) == "completed"
    assert message_status(conn, stale_one) == "processing"


@pytest.mark.parametrize("call", [
    "SELECT * FROM courier.report_outcomes(ARRAY[1], NULL, ARRAY['success'], ARRAY[NULL])",
    "SELECT * FROM courier.report_outcomes(ARRAY[1], ARRAY[NULL]::integer[], ARRAY['success'], ARRAY[NULL])",
    "SELECT courier.release_batch(ARRAY[1, 2], ARRAY[1])",
    "SELECT courier.renew_leases(ARRAY[1], ARRAY[]::integer[])",
], ids=["report-without-leases", "report-null-lease", "release-short", "renew-short"])
def test_every_report_release_and_renewal_needs_a_lease_per_id(conn, hook, call):
    send(conn)
    claim(conn, hook, "w")
    with pytest.raises(Exception, match="needs the lease its claim returned") as caught:
        conn.execute(call)
    assert caught.value.sqlstate == "22023"
    assert scalar(conn, "SELECT status FROM courier.queue") == "processing"


def test_a_renewed_lease_keeps_a_slow_delivery_from_recovery(conn, hook):
    message = send(conn)
    (held,) = claim(conn, hook, "slow-but-alive")
    go_stale(conn)
    assert scalar(conn, "SELECT courier.renew_leases(%s, %s)", ([held[0]], [held[1]])) == 1
    assert scalar(conn, "SELECT courier.recover_stale_messages()") == 0
    assert report(conn, [held]) == (1, 0, 0, 0)
    assert message_status(conn, message) == "completed"


def test_a_stale_lease_cannot_be_renewed(conn, hook):
    send(conn)
    (first,) = claim(conn, hook, "w1")
    go_stale(conn)
    conn.execute("SELECT courier.recover_stale_messages()")
    claim(conn, hook, "w2")
    assert scalar(conn, "SELECT courier.renew_leases(%s, %s)", ([first[0]], [first[1]])) == 0


# 2. Stale recovery counts the attempt ---------------------------------------------------


def test_a_message_that_keeps_killing_its_worker_is_dead_lettered_past_max_retries(conn, hook):
    conn.execute("SELECT courier.alter_endpoint('hook', p_retry_policy := '{\"max_retries\": 2}')")
    message = send(conn)
    for attempt in (1, 2):
        assert claim(conn, hook, f"doomed-{attempt}")
        go_stale(conn)
        assert scalar(conn, "SELECT courier.recover_stale_messages()") == 1
        assert scalar(conn, "SELECT retry_count FROM courier.queue WHERE id = %s", (message,)) == attempt
    assert claim(conn, hook, "doomed-3")
    go_stale(conn)
    assert scalar(conn, "SELECT courier.recover_stale_messages()") == 1
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    dead = conn.execute("SELECT status, retry_count, last_error FROM courier.dlq "
                        "WHERE original_message_id = %s", (message,)).fetchone()
    assert dead[:2] == ("failed", 3)
    assert "recovered from stale processing 3 times; max_retries (2) exceeded" in dead[2]
    assert message_status(conn, message) == "failed"


# 3. Ordering keys per endpoint ------------------------------------------------------------


def test_an_ordering_key_in_use_on_one_endpoint_does_not_block_another(conn, hook):
    other = scalar(conn, "SELECT courier.create_endpoint('other', 'noop', '{}')")
    mine = send(conn, key="customer-1")
    theirs = send(conn, endpoint="other", key="customer-1")
    assert [i for i, _ in claim(conn, hook, "w")] == [mine]
    assert [i for i, _ in claim(conn, other, "w")] == [theirs]  # was [] while hook held the key


def test_the_same_key_still_orders_messages_within_an_endpoint(conn, hook):
    first, second = send(conn, '{"n": 1}', key="k"), send(conn, '{"n": 2}', key="k")
    held = claim(conn, hook, "w")
    assert [i for i, _ in held] == [first]
    assert claim(conn, hook, "w") == []
    report(conn, held)
    assert [i for i, _ in claim(conn, hook, "w")] == [second]


def test_redrive_keeps_per_key_order_whatever_order_the_messages_failed_in(conn, hook):
    first, second, third = (send(conn, f'{{"n": {n}}}', key="k") for n in (1, 2, 3))
    conn.execute("SELECT courier._dead_letter(%s)", ([third, first, second],))  # failed out of order
    assert scalar(conn, "SELECT courier.redrive_endpoint('hook')") == 3
    order = []
    while held := claim(conn, hook, "w"):
        order.extend(scalar(conn, "SELECT payload->>'n' FROM courier.queue WHERE id = %s", (i,)) for i, _ in held)
        report(conn, held)
    assert order == ["1", "2", "3"]


# 4. Redrive everything ------------------------------------------------------------------


@pytest.mark.parametrize("call", ["SELECT courier.redrive_endpoint('hook')", "SELECT courier.redrive_all()"])
def test_redrive_endpoint_and_redrive_all_redrive_everything(conn, hook, call):
    ids = scalar(conn, "SELECT courier.send_batch('hook', ARRAY(SELECT '{}'::jsonb FROM generate_series(1, 2500)))")
    conn.execute("SELECT courier._dead_letter(%s)", (ids,))
    assert scalar(conn, call) == 2500  # stopped at 1,000 before
    assert scalar(conn, "SELECT count(*) FROM courier.dlq WHERE status = 'failed'") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 2500
    assert scalar(conn, "SELECT courier.redrive_endpoint('hook', 100)") == 0  # batches still work


# 4. Dead workers (issue 23) -----------------------------------------------------------------


def worker_session(login_as, worker: str, incarnation: str):
    """A connection as a new member of courier_admin (not the owner, not the caller of the
    recovery), registered as a session of the worker process `incarnation`."""
    session = login_as("courier_admin")
    session.execute("SELECT courier.register_worker_session(%s, %s)", (worker, incarnation))
    return session


def end_session(conn, session) -> None:
    """Close a session and wait until its backend has exited (closing returns before that)."""
    pid = session.info.backend_pid
    session.close()
    deadline = time.monotonic() + 10
    while scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)):
        assert time.monotonic() < deadline, "the backend did not exit"
        time.sleep(0.01)


def recover_dead(conn, grace: int = 0) -> int:
    return scalar(conn, "SELECT courier.recover_dead_workers_claims(%s)", (grace,))


def test_a_dead_workers_claims_are_recovered_once_its_sessions_end_and_its_late_report_is_fenced(conn, hook,
                                                                                                  login_as):
    send(conn, key="k")
    send(conn, key="k")
    dead = worker_session(login_as, "w-dead", "run-1")
    (held,) = claim(dead, hook, "w-dead")
    assert recover_dead(login_as("courier_admin")) == 0, "its session is alive: nothing is taken from it"
    end_session(conn, dead)
    # Another role, whose pg_stat_activity rows it cannot read, asks: the function sees as the owner.
    assert recover_dead(login_as("courier_admin")) == 1
    row = conn.execute("SELECT status, retry_count, last_error FROM courier.queue WHERE id = %s", (held[0],)).fetchone()
    assert row == ("pending", 1, "Recovered from a dead worker (its database sessions ended)")
    assert claim(conn, hook, "successor")[0][0] == held[0], "the key is unblocked, its first message first"
    assert report(conn, [held]) == (0, 0, 0, 1), "the dead worker's late report is a no-op"
    assert stale_reports_total(conn) == 1
    assert scalar(conn, "SELECT count(*) FROM courier.event_log WHERE event_type = 'report.stale_lease'") == 1
    assert scalar(conn, "SELECT details FROM courier.event_log "
                        "WHERE event_type = 'messages.dead_worker_recovered'") == {
        "worker_id": "w-dead", "count": 1, "dead_lettered": 0}
    assert scalar(conn, "SELECT count(*) FROM courier.worker_sessions") == 0


def heartbeat(session, worker: str) -> None:
    session.execute("SELECT courier.worker_heartbeat(%s, 'host-1', 4242, 8, 0, 0, 0, 'running')", (worker,))


def worker_shown(conn, worker: str) -> tuple:
    return conn.execute("SELECT state, alive, connected FROM courier.get_worker_status() WHERE worker_id = %s",
                        (worker,)).fetchone()


def test_a_killed_worker_is_shown_dead_at_once_and_lost_once_recovered(conn, hook, login_as):
    """Its heartbeat is seconds old, but its sessions are gone: before, it showed as alive (and
    the health check counted it) until the heartbeat was 30 s old."""
    session = worker_session(login_as, "w-killed", "run-1")
    heartbeat(session, "w-killed")
    assert worker_shown(conn, "w-killed") == ("running", True, True)
    end_session(conn, session)
    assert worker_shown(conn, "w-killed") == ("running", False, False)
    assert "0 worker(s) alive" in scalar(conn, "SELECT detail FROM courier.health_check() WHERE check_name = 'workers'")
    recover_dead(conn)  # forgets its sessions: it stays dead, as 'lost', not alive by its heartbeat again
    assert worker_shown(conn, "w-killed") == ("lost", False, None)
    assert scalar(conn, "SELECT details FROM courier.event_log WHERE event_type = 'worker.lost'") == {
        "worker_id": "w-killed"}
    heartbeat(worker_session(login_as, "w-killed", "run-2"), "w-killed")  # started again under its id
    assert worker_shown(conn, "w-killed") == ("running", True, True)


def test_after_a_database_restart_a_worker_is_judged_by_its_heartbeat_then_by_its_sessions(conn, hook,
                                                                                           login_as):
    """Within 15 s of the server's start a worker whose sessions all predate it is judged by its
    heartbeat (it may still be reconnecting); after that, by its sessions: it registered none
    since, so it died meanwhile (tests/test_worker_liveness.py restarts a real server)."""
    session = worker_session(login_as, "w-restart", "run-1")
    heartbeat(session, "w-restart")
    end_session(conn, session)
    # As after a restart: every session it registered predates the server's start.
    conn.execute("UPDATE courier.worker_sessions SET registered_at = pg_postmaster_start_time() - interval '1 s'")
    settled = scalar(conn, "SELECT now() - pg_postmaster_start_time() > interval '15 seconds'")
    assert worker_shown(conn, "w-restart") == (("running", False, False) if settled else ("running", True, None))


def test_a_worker_is_alive_while_any_of_its_sessions_is_and_a_grace_covers_a_reconnect(conn, hook, login_as):
    send(conn)
    first = worker_session(login_as, "w-pool", "run-1")
    second = worker_session(login_as, "w-pool", "run-1")
    (held,) = claim(first, hook, "w-pool")
    go_stale(conn)  # even an old claim: liveness, not age, decides here
    end_session(conn, first)
    assert recover_dead(conn) == 0 and message_status(conn, held[0]) == "processing"
    assert scalar(conn, "SELECT count(*) FROM courier.worker_sessions") == 1, "the closed session is forgotten"
    end_session(conn, second)
    assert recover_dead(conn, grace=60) == 0, "within the grace a live worker may reconnect"
    worker_session(login_as, "w-pool", "run-1")  # it did: alive again
    assert recover_dead(conn, grace=0) == 0 and message_status(conn, held[0]) == "processing"


def test_a_restart_under_the_same_worker_id_keeps_its_own_claims(conn, hook, login_as):
    send(conn)
    send(conn)
    old = worker_session(login_as, "fixed-id", "run-1")
    (old_claim,) = claim(old, hook, "fixed-id", batch=1)
    end_session(conn, old)
    new = worker_session(login_as, "fixed-id", "run-2")
    (new_claim,) = claim(new, hook, "fixed-id", batch=1)
    assert recover_dead(conn) == 1
    assert message_status(conn, old_claim[0]) == "pending"
    assert message_status(conn, new_claim[0]) == "processing"
    assert report(new, [new_claim]) == (1, 0, 0, 0)


def test_a_half_open_probe_held_by_a_dead_worker_is_probed_again_at_once(conn, hook, login_as):
    conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '1')")
    message = send(conn)
    report(conn, claim(conn, hook, "w1"), "retryable")
    conn.execute("UPDATE courier.endpoints SET circuit_half_open_at = now() - interval '1 second'")
    conn.execute("UPDATE courier.queue SET next_retry_at = NULL")
    dead = worker_session(login_as, "w-dead", "run-1")
    assert [m for m, _ in claim(dead, hook, "w-dead")] == [message]  # the half-open probe
    end_session(conn, dead)
    assert recover_dead(conn) == 1
    # The probe never answered: another is sent now, not after a whole cooldown (30 s).
    assert [m for m, _ in claim(conn, hook, "successor")] == [message]
    assert scalar(conn, "SELECT circuit_state FROM courier.endpoints") == "half_open"
