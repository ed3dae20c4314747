"""The console's live behaviour: the embedded pool scaled from the Workers pane, a database
that goes away and comes back, and polls that stop behind modals and hidden panes."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psycopg
import pytest
from textual.widgets import Input

from console.app.panes.overview import OverviewPane
from console.app.widgets.banner import ConnectionBanner
from console.app.widgets.live_table import LiveTable
from console.workers.supervisor import EmbeddedPool
from tests.console_driver import open_pane, run_console, wait_for
from tests.helpers import scalar
from tests.tcp_proxy import PostgresProxy
from tests.test_cli import COURIER


def heartbeat(conn, worker_id: str):
    return conn.execute("SELECT concurrency, state, pid FROM courier.workers WHERE worker_id = %s",
                        (worker_id,)).fetchone()


def test_workers_pane_starts_scales_and_stops_the_embedded_pool(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('sink', 'noop', '{}')")
    conn.execute("SELECT courier.send_batch('sink', ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, 200) g))")
    pool = EmbeddedPool(dsn, concurrency=4, drain_timeout=5)
    worker_id = pool.state.worker_id

    async def scenario(pilot, app):
        await open_pane(pilot, "workers")
        await pilot.press("s")
        first = await wait_for(pilot, lambda: heartbeat(conn, worker_id), timeout=30, what="the pool's heartbeat")
        assert first[0] == 4
        await pilot.press("plus")
        await wait_for(pilot, lambda: heartbeat(conn, worker_id)[0] == 5, timeout=15, what="scale to 5")
        await pilot.press("equals_sign")
        await pilot.pause(0.2)
        app.screen.query_one(Input).value = "12"  # the prompt is a modal screen
        await pilot.press("enter")
        await wait_for(pilot, lambda: heartbeat(conn, worker_id)[0] == 12, timeout=15, what="scale to 12")
        assert heartbeat(conn, worker_id)[2] == first[2], "scaling must not restart the child"
        await wait_for(pilot, lambda: scalar(conn, "SELECT count(*) FROM courier.archive") == 200, timeout=30,
                       what="the pool to deliver everything")
        await pilot.press("x")
        await wait_for(pilot, lambda: not pool.state.running and heartbeat(conn, worker_id)[1] == "stopped",
                       timeout=30, what="the pool to stop")
    try:
        run_console(dsn, scenario, pool=pool)
    finally:
        pool.stop()


def test_console_survives_the_database_going_away_and_coming_back(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('sink', 'noop', '{}')")
    proxy = PostgresProxy(dsn)

    async def scenario(pilot, app):
        await open_pane(pilot, "overview")
        banner = app.main.query_one(ConnectionBanner)
        assert not banner.has_class("-lost")
        proxy.cut()
        await wait_for(pilot, lambda: app.connection_error, timeout=20, what="the connection to be noticed lost")
        assert banner.has_class("-lost")
        assert "unreachable" in str(banner.render())
        await pilot.press("2")  # the UI stays responsive without a database
        await pilot.press("1")
        proxy.restore()
        await wait_for(pilot, lambda: not app.connection_error, timeout=30, what="the reconnection")
        assert not app.main.query_one(ConnectionBanner).has_class("-lost")
        conn.execute("SELECT courier.send('sink', '{}')")
        await wait_for(pilot, lambda: str(app.pane.query_one("#tile-pending").render()) == "1", timeout=15,
                       what="fresh data after the reconnection")
    try:
        run_console(proxy.proxied_dsn, scenario, refresh_scale=0.25)
    finally:
        proxy.close()


def test_polls_pause_behind_a_modal_and_on_hidden_panes(dsn, monkeypatch):
    polls: list[str] = []
    original = OverviewPane.fetch

    def counting(self, conn: psycopg.Connection):
        polls.append("overview")
        return original(self, conn)
    monkeypatch.setattr(OverviewPane, "fetch", counting)

    async def scenario(pilot, app):
        await open_pane(pilot, "overview")
        await pilot.pause(0.5)
        assert len(polls) >= 2  # refresh_scale 0.05: a poll every 0.1 s while visible
        await pilot.press("question_mark")
        await pilot.pause(0.3)
        behind_modal = len(polls)
        await pilot.pause(0.6)
        assert len(polls) <= behind_modal + 1
        await pilot.press("escape")
        await pilot.press("6")
        await pilot.pause(0.3)
        hidden = len(polls)
        await pilot.pause(0.6)
        assert len(polls) <= hidden + 1
        await pilot.press("1")
        await pilot.pause(0.6)
        assert len(polls) > hidden + 1
    run_console(dsn, scenario, refresh_scale=0.05)


@pytest.mark.parametrize("pane", ["overview", "endpoints", "messages", "dlq", "archive", "events", "workers", "tokens"])
def test_each_pane_loads_against_an_empty_database(dsn, pane):
    async def scenario(pilot, app):
        await open_pane(pilot, pane)
        assert app.pane.loaded
    run_console(dsn, scenario, size=(80, 24))


def test_a_killed_worker_is_shown_lost_at_once_not_alive_for_its_heartbeats_30_s(dsn, conn):
    worker = subprocess.Popen([str(COURIER), "worker", "--dsn", dsn, "--processes", "1", "--worker-id", "w-killed"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def shown(app) -> str:
        table = app.pane.query_one(LiveTable)
        return str(table.get_row("w-killed")[1]) if "w-killed" in table.rows else ""

    async def scenario(pilot, app):
        await open_pane(pilot, "workers")
        await wait_for(pilot, lambda: shown(app) == "running", timeout=30, what="the worker to heartbeat")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        killed_at = time.monotonic()
        await wait_for(pilot, lambda: shown(app) == "lost", timeout=15, what="the worker shown lost")
        assert time.monotonic() - killed_at < 10, "its heartbeat was still fresh: its sessions said it was gone"
        await open_pane(pilot, "overview")
        await wait_for(pilot, lambda: "0" in str(app.pane.query_one("#tile-workers").render()), timeout=10,
                       what="the workers tile to count it out")
    try:
        run_console(dsn, scenario)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
