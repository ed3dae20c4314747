"""`courier status`, `metrics`, `events` and `archive ...` as a user runs them."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import report, scalar
from tests.test_cli import COURIER, ENV, assert_ok, assert_one_line_error, assert_usage_error, run


@pytest.fixture
def courier(dsn):
    return lambda *args, stdin="": run(*args, dsn=dsn, stdin=stdin)


@pytest.fixture
def busy(conn):
    """Two endpoints with traffic: delivered, dead-lettered and pending messages, an open circuit."""
    for name in ("billing", "shipping"):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    ids = scalar(conn, "SELECT courier.send_batch('billing', ARRAY(SELECT jsonb_build_object('n', g) "
                       "FROM generate_series(1, 6) g))")
    conn.execute("SELECT courier.claim_batch('w', 6, 1)")
    report(conn, ids, ["success"] * 4 + ["permanent"] * 2, [None] * 4 + ["[PERMANENT] HTTP 400"] * 2)
    conn.execute("SELECT courier.send_batch('shipping', ARRAY['{}'::jsonb, '{}', '{}'])")
    conn.execute("UPDATE courier.endpoints SET circuit_state = 'open' WHERE name = 'shipping'")
    return conn


def test_status_shows_depth_dlq_circuits_workers_and_health(courier, busy):
    state = assert_ok(courier("status", "--json")).json()
    assert state["queue_depth"]["pending"] == 3 and state["dlq_depth"] == 2
    by_name = {e["endpoint"]: e for e in state["endpoints"]}
    assert by_name["shipping"]["circuit"] == "open" and by_name["shipping"]["pending"] == 3
    assert by_name["billing"]["dlq_failed"] == 2
    assert state["oldest_pending_age_seconds"] >= 0 and state["workers"] == []
    health = {check["check_name"]: check["status"] for check in state["health"]}
    assert health["circuits"] == "warning" and health["workers"] == "critical" and health["dlq"] == "warning"
    shown = assert_ok(courier("status")).text
    for fragment in ("pending 3", "DLQ 2", "shipping", "open", "critical"):
        assert fragment in shown


def test_status_shows_late_and_failing_schedules_one_line_each(courier, busy):
    busy.execute("SELECT courier.create_schedule('nightly', '0 3 * * *', 'billing', p_time_zone => 'Europe/Berlin')")
    busy.execute("SELECT courier.create_schedule('minutely', '* * * * *', 'shipping')")
    busy.execute("SELECT courier.create_schedule('on-time', '* * * * *', 'shipping')")
    busy.execute("SELECT courier.create_schedule('held', '* * * * *', 'shipping')")
    busy.execute("SELECT courier.pause_schedule('held')")
    busy.execute("UPDATE courier.schedules SET next_run_at = now() - interval '2 hours' "
                 "WHERE name IN ('nightly', 'held')")
    busy.execute("UPDATE courier.schedules SET next_run_at = now() - interval '5 minutes', last_error_at = now(), "
                 "last_error = '[courier] endpoint \"shipping\" is disabled' WHERE name = 'minutely'")
    state = assert_ok(courier("status", "--json")).json()
    late = {s["name"]: s for s in state["late_schedules"]}
    assert sorted(late) == ["minutely", "nightly"]  # not the paused one, nor the one on time
    assert 7190 < late["nightly"]["late_seconds"] < 7300 and late["nightly"]["time_zone"] == "Europe/Berlin"
    assert "disabled" in late["minutely"]["last_error"]
    health = {check["check_name"]: check for check in state["health"]}
    assert health["schedules"]["status"] == "warning"
    assert health["schedules"]["detail"] == "2 late: nightly, minutely (failing)"
    lines = assert_ok(courier("status")).out.splitlines()
    (nightly,) = [" ".join(line.split()) for line in lines if "│ nightly " in line]
    assert "│ late │ 2.0 h │" in nightly and "0 3 * * *" in nightly and " CE" in nightly  # on its clock: CET or CEST
    (minutely,) = [" ".join(line.split()) for line in lines if "│ minutely " in line]
    assert "│ failing │ 5 min │" in minutely and '[courier] endpoint "shipping" is disabled' in minutely
    assert not [line for line in lines if "│ held " in line or "│ on-time " in line]


def test_prometheus_exposition_parses_and_matches_metrics(courier, busy):
    text = assert_ok(courier("metrics", "--prometheus")).out
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    expected = busy.execute("SELECT metric_name, metric_value, labels, metric_type FROM courier.metrics()").fetchall()
    assert len(expected) > 20
    for name, value, labels, kind in expected:
        sample_name = "courier_" + name + ("" if kind == "gauge" or name.endswith("_total") else "_total")
        exposed = samples[(sample_name, tuple(sorted((k, str(v)) for k, v in labels.items())))]
        assert exposed == (pytest.approx(value, abs=10) if name.endswith("_age_seconds") else value), name
    assert samples[("courier_messages_delivered_total", (("endpoint", "billing"),))] == 4
    assert samples[("courier_endpoint_circuit_state", (("endpoint", "shipping"),))] == 2
    assert "# TYPE courier_messages_dead_lettered_total counter" in text
    listed = assert_ok(courier("metrics", "--json")).json()
    assert len(listed) == len(expected)


def test_events_and_filters(courier, busy):
    busy.execute("SELECT courier.set_setting('retry_base_delay', '20')")
    shown = [json.loads(line) for line in assert_ok(courier("events", "--json")).out.splitlines()]
    kinds = [event["event_type"] for event in shown]
    assert "endpoint.created" in kinds and kinds[-1] == "config.changed"
    only = [json.loads(line) for line in assert_ok(courier("events", "--json", "--type", "endpoint",
                                                           "--endpoint", "billing")).out.splitlines()]
    assert [(e["event_type"], e["endpoint"]) for e in only] == [("endpoint.created", "billing")]
    assert "config.changed" in assert_ok(courier("events", "--limit", "1")).text


def test_events_follow_prints_new_events_as_they_come(dsn, busy):
    follower = subprocess.Popen([str(COURIER), "events", "--follow", "--json", "--limit", "1", "--interval", "0.2",
                                 "--dsn", dsn], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())
        busy.execute("SELECT courier.disable_endpoint('billing')")
        followed = json.loads(follower.stdout.readline())
        assert followed["id"] > first["id"] and followed["event_type"] == "endpoint.disabled"
    finally:
        follower.terminate()
        follower.wait(10)


def test_archive_partitions(courier, busy):
    listed = assert_ok(courier("archive", "partitions", "--exact", "--json")).json()
    this_month = datetime.now(UTC).strftime("archive_%Y_%m")
    rows = {p["partition_name"]: p["rows"] for p in listed}
    assert rows[this_month] == 6 and rows["archive_default"] == 0 and len(rows) == 5
    assert this_month in assert_ok(courier("archive", "partitions")).out


def test_archive_replay_dry_run_then_replay_with_the_count(courier, busy):
    today = datetime.now(UTC).date()
    window = ["--endpoint", "billing", "--from", str(today), "--to", str(today + timedelta(days=1))]
    dry = assert_ok(courier("archive", "replay", *window, "--status", "failed", "--dry-run", "--json")).json()
    assert dry["would_replay"] == 2
    assert scalar(busy, "SELECT count(*) FROM courier.queue WHERE endpoint_id = 1") == 0
    done = assert_ok(courier("archive", "replay", *window, "--status", "failed", "--yes"))
    assert "replayed 2 message(s) of billing" in done.text
    assert scalar(busy, "SELECT count(*) FROM courier.queue WHERE endpoint_id = 1") == 2
    everything = assert_ok(courier("archive", "replay", *window, "--batch-size", "4", "--json")).json()
    assert everything["replayed"] == 4 and everything["already_replayed"] == 2  # the failed two: once


def test_archive_replay_twice_enqueues_once_and_says_so_unless_again(courier, busy):
    today = datetime.now(UTC).date()
    window = ["--endpoint", "billing", "--from", str(today), "--to", str(today + timedelta(days=1)), "--yes"]
    assert "replayed 6 message(s) of billing" in assert_ok(courier("archive", "replay", *window)).text
    dry = assert_ok(courier("archive", "replay", *window, "--dry-run")).text
    assert "would replay 0 message(s) of billing; 6 replayed before, skipped (--again enqueues fresh copies)" in dry
    second = assert_ok(courier("archive", "replay", *window, "--batch-size", "2")).text
    assert "replayed 0 message(s) of billing; 6 replayed before, skipped" in second
    assert scalar(busy, "SELECT count(*) FROM courier.queue WHERE endpoint_id = 1") == 6
    again = assert_ok(courier("archive", "replay", *window, "--again", "--json")).json()
    assert (again["replayed"], again["already_replayed"], again["again"]) == (6, 6, True)
    copies = busy.execute("SELECT metadata ->> 'replayed_from', count(*) FROM courier.queue WHERE endpoint_id = 1 "
                          "GROUP BY 1").fetchall()
    assert len(copies) == 6 and {n for _, n in copies} == {2}


def test_an_interrupted_cli_replay_resumes(courier, busy):
    busy.execute("SELECT courier.set_setting('max_queue_size', '7')")  # 3 pending + 4 more fit
    today = datetime.now(UTC).date()
    window = ["--endpoint", "billing", "--from", str(today), "--to", str(today + timedelta(days=1)), "--yes"]
    assert_one_line_error(courier("archive", "replay", *window, "--batch-size", "2"), "backpressure", "53400")
    assert scalar(busy, "SELECT count(*) FROM courier.queue WHERE endpoint_id = 1") == 4
    busy.execute("SELECT courier.set_setting('max_queue_size', '0')")
    dry = assert_ok(courier("archive", "replay", *window, "--dry-run")).text
    assert "would replay 2 message(s) of billing; 4 replayed before, skipped (--again enqueues fresh copies) " \
           "(resuming replay #1)" in dry
    assert "replayed 2 message(s)" in assert_ok(courier("archive", "replay", *window)).text
    origins = [row[0] for row in busy.execute("SELECT metadata ->> 'replayed_from' FROM courier.queue "
                                              "WHERE endpoint_id = 1 ORDER BY id")]
    assert sorted(origins) == sorted(set(origins)) and len(origins) == 6


def test_archive_replay_message(courier, busy):
    archived_id = scalar(busy, "SELECT min(id) FROM courier.archive")
    done = assert_ok(courier("archive", "replay-message", str(archived_id), "--json")).json()
    assert scalar(busy, "SELECT status FROM courier.queue WHERE id = %s", (done["message_id"],)) == "pending"
    twice = assert_ok(courier("archive", "replay-message", str(archived_id))).text
    assert f"archived message {archived_id} was replayed before as message {done['message_id']}; nothing " \
           "enqueued (--again enqueues a fresh copy)" in twice
    fresh = assert_ok(courier("archive", "replay-message", str(archived_id), "--again", "--json")).json()
    assert fresh["enqueued"] and fresh["message_id"] > done["message_id"]
    assert scalar(busy, "SELECT count(*) FROM courier.queue WHERE metadata ->> 'replayed_from' = %s",
                  (str(archived_id),)) == 2
    assert_one_line_error(courier("archive", "replay-message", "424242"), "archived message 424242 does not exist",
                          "P0002")


def test_archive_replay_bad_input(courier, busy):
    assert_one_line_error(courier("archive", "replay", "--endpoint", "nope", "--from", "2026-01-01",
                                  "--to", "2026-02-01"), 'endpoint "nope" does not exist')
    assert_usage_error(courier("archive", "replay", "--endpoint", "billing", "--from", "2026-02-01",
                               "--to", "2026-01-01"), "must be later than --from")
    assert_usage_error(courier("archive", "replay", "--endpoint", "billing", "--from", "yesterday",
                               "--to", "2026-01-01"), "--from")
    assert_usage_error(courier("archive", "replay", "--endpoint", "billing", "--from", "2026-01-01",
                               "--to", "2026-02-01", "--status", "delivered"), "--status")
