"""`courier worker` started before its database (systemd, compose, Kubernetes): it waits and
retries with backoff, one log line per attempt, and exits only when told to."""

from __future__ import annotations

import json
import signal
import time

import pytest

from console.sink import WebhookSink
from tests.helpers import archived, scalar
from tests.tcp_proxy import PostgresProxy
from tests.workers import start_worker_process, wait_for


@pytest.fixture
def unreachable(dsn):
    """A proxy to the test's database that refuses every connection until restore()."""
    proxy = PostgresProxy(dsn)
    proxy.cut()
    yield proxy
    proxy.close()


def log_lines(process) -> list[dict]:
    return [json.loads(line) for line in process.stderr.so_far().splitlines() if line.startswith("{")]


def retries(process) -> list[dict]:
    return [line for line in log_lines(process) if line["msg"] == "database unavailable; retrying"]


def test_the_worker_waits_for_the_database_then_delivers(conn, unreachable):
    with WebhookSink() as sink:
        conn.execute("SELECT courier.create_endpoint('hook', 'http', %s::jsonb)",
                     (json.dumps({"url": f"{sink.url}/healthy", "allow_internal": True}),))
        message = scalar(conn, "SELECT courier.send('hook', '{\"n\": 1}')")
        worker = start_worker_process(unreachable.proxied_dsn)
        try:
            wait_for(lambda: len(retries(worker)) >= 3, timeout=30)
            assert worker.poll() is None, "still waiting, not exited"
            attempts = retries(worker)
            assert [line["attempt"] for line in attempts[:3]] == [1, 2, 3]
            assert attempts[1]["retry_in"] > attempts[0]["retry_in"], "backoff"
            assert "cannot connect to PostgreSQL" in attempts[0]["error"]
            unreachable.restore()
            wait_for(lambda: archived(conn) == 1, timeout=60)
        finally:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(30)
    assert code == 0
    assert [int(r.headers["x-courier-message-id"]) for r in sink.received] == [message]
    assert "Traceback" not in worker.stderr.read()


def test_sigterm_while_waiting_for_the_database_exits_at_once(unreachable):
    worker = start_worker_process(unreachable.proxied_dsn)
    wait_for(lambda: len(retries(worker)) >= 1, timeout=30)
    worker.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert worker.wait(10) == 0
    assert time.monotonic() - started < 3
    assert log_lines(worker)[-1]["msg"] == "stopped while waiting for the database"


def test_exit_if_unavailable_exits_1_with_one_line(unreachable):
    worker = start_worker_process(unreachable.proxied_dsn, "--exit-if-unavailable")
    assert worker.wait(30) == 1
    err = worker.stderr.read().strip()
    assert len(err.splitlines()) == 1 and "cannot connect to PostgreSQL" in err, err
    assert retries(worker) == []


def test_wait_for_database_limit_exits_1_with_one_line_after_it(unreachable):
    started = time.monotonic()
    worker = start_worker_process(unreachable.proxied_dsn, "--wait-for-database", "2")
    assert worker.wait(30) == 1
    assert time.monotonic() - started >= 2
    lines = [line for line in worker.stderr.read().splitlines() if not line.startswith("{")]
    assert len(lines) == 1 and "gave up waiting for the database after 2 s" in lines[0], lines
