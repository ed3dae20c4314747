"""The maintenance leader's metric samples (issue 41): written by one leader every interval,
kept for metric_samples_retention_hours, read back with rates per second of the time actually
between samples, a reset of the unlogged totals never a negative rate, and a gap where no
leader ran reported as a gap by `courier status --history` and drawn as one by the Overview."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from datetime import timedelta

import pytest
from textual_plotext import Plot

from console.app.panes import overview
from console.app.widgets.chart import Chart, line_chart
from console.workers.maintenance import MaintenanceSchedule
from console.workers.pool import PoolSettings, WorkerPool
from sqlkit import samples
from tests.console_driver import open_pane, run_console
from tests.helpers import report, scalar
from tests.test_cli import assert_ok, run
from tests.workers import run_pool_until


def sample_at(conn, seconds_ago: float, interval: float = 10.0) -> None:
    """A sample as the leader takes it, stamped seconds_ago (record_metric_samples() stamps now)."""
    conn.execute("INSERT INTO courier.metric_samples (sampled_at, endpoint_id, interval_seconds, pending, processing, "
                 "dlq, delivered, failed, dead_lettered) "
                 "SELECT now() - make_interval(secs => %s), r.endpoint_id, %s, r.pending, r.processing, r.dlq, "
                 "r.delivered, r.failed, r.dead_lettered FROM courier._metric_sample_rows() r",
                 (seconds_ago, interval))


def set_delivered(conn, endpoint: str, total: int) -> None:
    """The endpoint's delivered total, as the delivery functions' counters would hold it."""
    conn.execute("DELETE FROM courier.delivery_totals t USING courier.endpoints e "
                 "WHERE e.name = %s AND t.endpoint_id = e.id AND t.outcome = 'delivered'", (endpoint,))
    conn.execute("INSERT INTO courier.delivery_totals (endpoint_id, outcome, backend_pid, total) "
                 "SELECT id, 'delivered', 0, %s FROM courier.endpoints WHERE name = %s", (total, endpoint))


def sample_times(conn) -> list:
    return [at for (at,) in conn.execute(
        "SELECT sampled_at FROM courier.metric_samples WHERE endpoint_id = 0 ORDER BY sampled_at")]


# The SQL ---------------------------------------------------------------------------------------

def test_a_sample_holds_each_endpoints_depth_and_totals_and_the_whole_queues(conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('shipping', 'noop', '{}')")
    ids = scalar(conn, "SELECT courier.send_batch('billing', ARRAY(SELECT jsonb_build_object('n', g) "
                       "FROM generate_series(1, 6) g))")
    conn.execute("SELECT courier.claim_batch('w', 6, 1)")
    report(conn, ids[:5], ["success"] * 3 + ["permanent"] * 2, [None] * 3 + ["[PERMANENT] HTTP 400"] * 2)
    conn.execute("SELECT courier.send_batch('shipping', ARRAY['{}'::jsonb, '{}', '{}'])")
    assert samples.record(conn) == 0
    rows = {row[0]: row[1:] for row in conn.execute(
        "SELECT coalesce(e.name, 'queue'), s.pending, s.processing, s.dlq, s.delivered, s.failed, s.dead_lettered, "
        "s.interval_seconds FROM courier.metric_samples s LEFT JOIN courier.endpoints e ON e.id = s.endpoint_id")}
    # pending, in flight, DLQ, delivered, failed attempts (a permanent failure is one), dead-lettered
    assert rows == {"billing": (0, 1, 2, 3, 2, 2, 10.0), "shipping": (3, 0, 0, 0, 0, 0, 10.0),
                    "queue": (3, 1, 2, 3, 2, 2, 10.0)}


def test_one_sample_per_interval_however_often_it_is_asked_for(conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    samples.record(conn, 10)
    samples.record(conn, 10)  # a leader that hung past its lease and came back: within half an interval
    assert len(sample_times(conn)) == 1
    conn.execute("UPDATE courier.metric_samples SET sampled_at = sampled_at - interval '6 seconds'")
    samples.record(conn, 10)
    assert len(sample_times(conn)) == 2


def test_samples_past_the_retention_are_deleted_by_the_next_one(conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("SELECT courier.set_setting('metric_samples_retention_hours', '2')")
    for hours_ago in (3, 1.5):
        sample_at(conn, hours_ago * 3600)
    samples.record(conn)
    ages = [round(a) for (a,) in conn.execute(
        "SELECT extract(epoch FROM now() - sampled_at) / 3600 FROM courier.metric_samples "
        "WHERE endpoint_id = 0 ORDER BY sampled_at")]
    assert ages == [2, 0]  # 1.5 h kept, 3 h deleted
    assert scalar(conn, "SELECT count(*) FROM courier.metric_samples") == 4  # billing's and the queue's


def test_rates_are_per_second_of_the_time_between_samples_and_a_reset_is_no_negative_rate(conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("SELECT courier.create_endpoint('shipping', 'noop', '{}')")
    with conn.transaction():  # one now(): the samples exactly as far apart as they say
        set_delivered(conn, "billing", 1000)
        sample_at(conn, 40)
        set_delivered(conn, "billing", 1080)
        set_delivered(conn, "shipping", 5)
        sample_at(conn, 30)  # 80 and 5 in 10 s
        set_delivered(conn, "billing", 1240)
        sample_at(conn, 10)  # 160 in 20 s: a late sample, still 8/s (2 intervals: no gap yet)
        set_delivered(conn, "billing", 30)  # the server crashed: unlogged totals count from zero again
        sample_at(conn, 0)
        now = scalar(conn, "SELECT now()")
    whole = samples.history(conn, now - timedelta(minutes=1))
    assert [s.gap for s in whole] == [False] * 4
    assert [s.delivered for s in whole] == [None, 85, 160, 30]
    assert [None if s.delivered_per_second is None else round(s.delivered_per_second, 3) for s in whole] == \
        [None, 8.5, 8.0, 3.0]
    billing = [s for s in samples.history(conn, now - timedelta(minutes=1), per_endpoint=True)
               if s.endpoint_name == "billing"]
    assert [s.delivered for s in billing] == [None, 80, 160, 30]
    assert all(s.delivered_per_second is None or s.delivered_per_second >= 0 for s in billing)
    assert samples.latest_rates(samples.history(conn, now, per_endpoint=True)) == {"billing": 3.0, "shipping": 0.0}
    # The first sample of a window has its rate too: from the sample just before the window.
    assert samples.history(conn, now - timedelta(seconds=15))[0].delivered_per_second == pytest.approx(8.0)


def test_samples_further_apart_than_two_intervals_have_a_gap_between_them(conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    with conn.transaction():
        set_delivered(conn, "billing", 100)
        sample_at(conn, 300)
        sample_at(conn, 290)
        set_delivered(conn, "billing", 400)
        sample_at(conn, 60)  # nobody sampled for 230 s
        sample_at(conn, 50)
    history = samples.history(conn, scalar(conn, "SELECT now()") - timedelta(minutes=10))
    assert [s.gap for s in history] == [False, False, True, False]
    assert history[2].seconds == pytest.approx(230, abs=0.01)
    assert history[2].delivered == 300 and history[2].delivered_per_second is None  # counted, but no rate
    assert history[3].delivered_per_second == 0


def test_the_monitor_role_reads_the_history(conn, dsn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    sample_at(conn, 10)
    sample_at(conn, 0)
    conn.execute("SET ROLE courier_monitor")
    try:
        assert scalar(conn, "SELECT count(*) FROM courier.metric_history(now() - interval '1 minute')") == 2
        with pytest.raises(Exception, match="permission denied"):
            conn.execute("SELECT courier.record_metric_samples()")
    finally:
        conn.execute("RESET ROLE")


# A real worker -------------------------------------------------------------------------------

def test_a_worker_samples_and_status_history_reports_where_its_leader_stopped_as_a_gap(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('sink', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('sink', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 50) g))")
    schedule = MaintenanceSchedule(metric_samples=2.0)
    run_pool_until(dsn, lambda: len(sample_times(conn)) >= 3, timeout=30, maintenance=schedule)
    assert scalar(conn, "SELECT count(*) FROM courier.archive") == 50
    time.sleep(6)  # no worker, no leader, no samples: three intervals
    first_run = len(sample_times(conn))
    run_pool_until(dsn, lambda: len(sample_times(conn)) >= first_run + 3, timeout=30, maintenance=schedule)

    history = assert_ok(run("status", "--history", "--since", "5m", "-o", "json", dsn=dsn)).json()
    assert len(history) == len(sample_times(conn))
    gaps = [row for row in history if row["gap"]]
    assert len(gaps) == 1, history
    assert gaps[0]["seconds"] > 6 and gaps[0]["delivered_per_second"] is None
    steady = [row for row in history[1:] if not row["gap"]]
    assert all(2.0 <= row["seconds"] <= 4.0 for row in steady), [row["seconds"] for row in steady]
    assert sum(row["delivered"] for row in history[1:]) <= 50
    assert history[-1]["pending"] == 0 and history[-1]["interval_seconds"] == 2

    table = assert_ok(run("status", "--history", "--since", "5m", dsn=dsn)).text
    assert re.search(r"gap of \d+ s", table), table
    tsv = assert_ok(run("status", "--history", "-o", "tsv", dsn=dsn)).out.splitlines()
    assert tsv[0].split("\t")[:4] == ["sampled_at", "endpoint_name", "seconds", "gap"]
    assert sum(line.split("\t")[3] == "true" for line in tsv[1:]) == 1


def test_two_workers_write_one_series_between_them(dsn, conn):
    """Only the maintenance leader samples: two pools give one sample per interval, not two."""
    schedule = MaintenanceSchedule(metric_samples=2.0)
    pools = [WorkerPool(dsn, PoolSettings(poll_interval=0.1, maintenance=schedule, worker_id=f"w{n}"))
             for n in range(2)]

    async def main() -> None:
        tasks = [asyncio.create_task(pool.run()) for pool in pools]
        try:
            deadline = time.monotonic() + 30
            while len(await asyncio.to_thread(sample_times, conn)) < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            for pool in pools:
                pool.stop()
            await asyncio.gather(*tasks)
    asyncio.run(main())
    times = sample_times(conn)
    assert len(times) >= 4
    spacing = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert all(s >= 1.9 for s in spacing), spacing


def test_status_history_without_samples_says_why(dsn):
    result = assert_ok(run("status", "--history", dsn=dsn))
    assert "no samples in the last 60 min" in result.err
    assert assert_ok(run("status", "--history", "--json", dsn=dsn)).json() == []


# The Overview ----------------------------------------------------------------------------------

def test_a_console_opened_after_samples_exist_draws_its_charts_at_once(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('billing', ARRAY['{}'::jsonb, '{}'])")
    with conn.transaction():  # one now(): the samples exactly as far apart as they say
        for seconds_ago, delivered in ((240, 0), (230, 70), (220, 150), (60, 900), (50, 980), (30, 1140),
                                       (20, 1220)):
            set_delivered(conn, "billing", delivered)
            sample_at(conn, seconds_ago)
        set_delivered(conn, "billing", 30)  # a crash reset the totals since the last sample
        sample_at(conn, 10)

    async def scenario(pilot, app):
        await open_pane(pilot, "overview")  # its first poll
        pane = app.pane
        assert len(pane.samples) == 8
        for chart in ("#throughput-chart", "#depth-chart"):
            assert pane.query_one(chart, Chart)._waiting is None, f"{chart} is still collecting"
        now = pane.samples[-1].sampled_at
        # Drawn in runs: none across the 160 s nobody sampled; 20 s (two intervals) is no gap yet.
        pending = overview._segments(pane.samples, lambda s: s.pending, now)
        assert [len(run) for run in pending] == [3, 5]
        rates = overview._segments(pane.samples, lambda s: s.delivered_per_second, now)
        assert [[round(y, 1) for _, y in run] for run in rates] == [[7.0, 8.0], [8.0, 8.0, 8.0, 3.0]]
        row = pane.query_one("#overview-endpoints").get_row("billing")
        assert str(row[5]) == "3.0/s"  # the reset counted from zero: no negative rate, no spike
        assert str(row[2]) == "2"
    run_console(dsn, scenario)


def test_a_console_without_samples_says_where_they_come_from(dsn):
    async def scenario(pilot, app):
        await open_pane(pilot, "overview")
        waiting = app.pane.query_one("#depth-chart", Chart)._waiting
        assert waiting is not None and "maintenance leader" in waiting.plain
    run_console(dsn, scenario)


def test_a_line_broken_into_runs_draws_nothing_across_the_gap():
    plt = Plot()
    plt.plotsize(62, 12)
    runs = [[(-300.0 + 10 * n, 50.0) for n in range(6)], [(-100.0 + 10 * n, 50.0) for n in range(11)]]
    line_chart(plt, "depth", [("pending", runs), ("in flight", [[(-300.0, 5.0), (0.0, 5.0)]])], span=300)
    text = re.sub(r"\x1b\[[0-9;]*m", "", plt.build())
    line = next(row for row in text.splitlines() if any("\u2800" < c <= "\u28ff" for c in row))
    braille = [n for n, c in enumerate(line) if "\u2800" < c <= "\u28ff"]
    assert braille, text
    # Two runs, with the columns between -250 s and -100 s (half of the width) left empty.
    assert max(b - a for a, b in itertools.pairwise(braille)) > 62 // 4, text
    assert "pending" in text and "in flight" in text
