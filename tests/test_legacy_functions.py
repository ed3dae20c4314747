"""No superseded `_vN` worker function stays installed (issue 10, item 16): the old claim and
report functions skipped the lease fence and the endpoint's policy, and anyone with EXECUTE
on them could still call them."""

from __future__ import annotations

import re
from collections import defaultdict

LEGACY = {"claim_batch_v1", "claim_batch_v2", "complete_batch_v1", "fail_batch_v1", "release_batch_v1",
          "report_outcomes_v1"}


def versioned_functions(conn) -> list[str]:
    return [name for (name,) in conn.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = 'courier'::regnamespace AND proname ~ '_v[0-9]+$'")]


def test_only_the_latest_version_of_each_worker_function_is_installed(conn):
    installed = versioned_functions(conn)
    assert not LEGACY & set(installed)
    versions: dict[str, list[int]] = defaultdict(list)
    for name in installed:
        base, version = re.fullmatch(r"(.+)_v(\d+)", name).groups()
        versions[base].append(int(version))
    assert {base: v for base, v in versions.items() if len(v) > 1} == {}
    # What stays: the current worker primitives, one signature each.
    assert sorted(installed) == ["claim_batch_v3", "register_worker_session_v1", "release_batch_v2", "renew_leases_v1",
                                 "report_and_claim_v1", "report_outcomes_v2", "sends_committing_v1",
                                 "try_lead_maintenance_v1", "worker_heartbeat_v1"]


def test_no_worker_function_is_executable_by_applications_or_monitors(conn):
    callable_by = conn.execute(
        "SELECT p.proname, r.rolname FROM pg_proc p CROSS JOIN pg_roles r "
        "WHERE p.pronamespace = 'courier'::regnamespace AND p.proname ~ '_v[0-9]+$' "
        "AND r.rolname IN ('courier_application', 'courier_monitor') "
        "AND has_function_privilege(r.oid, p.oid, 'EXECUTE')").fetchall()
    assert callable_by == []
