"""Worker functions are installed once, under their plain names (issue 24): no superseded `_vN`
version stays (issue 10, item 16: the old claim and report functions skipped the lease fence
and the endpoint's policy, and anyone with EXECUTE on them could still call them), and only
Courier's admin role, which runs workers, may call them."""

from __future__ import annotations

WORKER_FUNCTIONS = ["claim_batch", "register_worker_session", "release_batch", "renew_leases", "report_and_claim",
                    "report_outcomes", "sends_committing", "try_lead_maintenance", "worker_heartbeat"]


def test_no_versioned_function_is_installed(conn):
    versioned = [name for (name,) in conn.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = 'courier'::regnamespace AND proname ~ '_v[0-9]+$'")]
    assert versioned == []


def test_each_worker_function_has_one_signature(conn):
    installed = [name for (name,) in conn.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = 'courier'::regnamespace AND proname = ANY (%s) "
        "ORDER BY proname", (WORKER_FUNCTIONS,))]
    assert installed == WORKER_FUNCTIONS


def test_no_worker_function_is_executable_by_applications_or_monitors(conn):
    callable_by = conn.execute(
        "SELECT p.proname, r.rolname FROM pg_proc p CROSS JOIN pg_roles r "
        "WHERE p.pronamespace = 'courier'::regnamespace AND p.proname = ANY (%s) "
        "AND r.rolname IN ('courier_application', 'courier_monitor') "
        "AND has_function_privilege(r.oid, p.oid, 'EXECUTE')", (WORKER_FUNCTIONS,)).fetchall()
    assert callable_by == []
    admin = conn.execute(
        "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'courier'::regnamespace AND p.proname = ANY (%s) "
        "AND has_function_privilege('courier_admin', p.oid, 'EXECUTE')", (WORKER_FUNCTIONS,)).fetchone()[0]
    assert admin == len(WORKER_FUNCTIONS)
