"""`courier demo --headless` as a user runs it: a real subprocess with its sink, producer and
worker child, against the test database or an embedded PostgreSQL of its own."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from sqlkit import embedded
from tests.helpers import scalar
from tests.test_cli import COURIER
from tests.test_embedded_pool import descendants, survivors

DSN_VARIABLES = ("COURIER_DSN", "DATABASE_URL")


def demo_env(data_dir: Path) -> dict[str, str]:
    """No database configured but the command line, and the embedded data dir (and the
    demo's worker log) in a temporary directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k not in DSN_VARIABLES}
    env["COURIER_DATA_DIR"] = str(data_dir)
    return env


def run_demo(args: list[str], env: dict[str, str], timeout: float = 90) -> tuple[subprocess.CompletedProcess[str],
                                                                                  set[int]]:
    """Run `courier demo ARGS`; return the result and every descendant seen while it ran."""
    process = subprocess.Popen([str(COURIER), "demo", *args], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None and time.monotonic() < deadline:
            seen |= descendants(process.pid)
            time.sleep(0.2)
        out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), seen


def test_headless_demo_delivers_opens_a_circuit_and_leaves_nothing_behind(dsn, conn, tmp_path):
    result, seen = run_demo(["--headless", "--seconds", "12", "--dsn", dsn], demo_env(tmp_path))
    assert result.returncode == 0, result
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "delivered" in line]
    assert len(lines) >= 3 and lines[-1].startswith("stopped: "), result.stdout
    assert "demo-down=open" in result.stdout
    assert seen, "the worker pool runs as a child process"
    time.sleep(0.5)  # a reaper may lag behind the exit
    assert survivors(seen) == []
    circuits = dict(conn.execute("SELECT name, circuit_state FROM courier.endpoints").fetchall())
    assert circuits["demo-down"] == "open" and circuits["demo-healthy"] == "closed"
    assert scalar(conn, "SELECT count(*) FROM courier.archive a JOIN courier.endpoints e "
                        "ON e.id = a.endpoint_id WHERE e.name = 'demo-healthy' AND a.status = 'completed'") >= 50
    worker = conn.execute("SELECT worker_id, state, delivered FROM courier.workers").fetchall()
    assert len(worker) == 1 and worker[0][0].startswith("console:") and worker[0][1] == "stopped"
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 0
    assert (tmp_path / "demo-workers.log").read_text().count('"worker stopped"') == 1


def test_headless_demo_json_summary(dsn, tmp_path):
    result, _ = run_demo(["--headless", "--seconds", "1", "--rate", "20", "--json", "--dsn", dsn],
                         demo_env(tmp_path))
    assert result.returncode == 0, result
    summary = json.loads(result.stdout)  # the status lines went to stderr
    assert summary["worker_exit_code"] == 0 and summary["embedded_stopped"] is False
    assert set(summary["circuits"]) == {"demo-healthy", "demo-flaky", "demo-slow", "demo-down"}
    assert "delivered" in result.stderr


@pytest.mark.timeout(180)
def test_demo_stops_the_embedded_postgres_it_started_and_only_that(tmp_path, monkeypatch):
    """Starts a PostgreSQL of its own (initdb included): about 15 s."""
    env = demo_env(tmp_path)
    monkeypatch.setenv("COURIER_DATA_DIR", str(tmp_path))
    started, seen = run_demo(["--headless", "--seconds", "8"], env)
    assert started.returncode == 0, started
    assert "the embedded PostgreSQL this demo started is stopped" in " ".join(started.stdout.split())
    assert not embedded.status().running
    assert (tmp_path / "pgdata" / "PG_VERSION").exists(), "the data stays for the next run"
    time.sleep(0.5)
    assert survivors(seen) == []
    # A server that was already running is left running.
    url = embedded.start()
    try:
        again, _ = run_demo(["--headless", "--seconds", "2"], env)
        assert again.returncode == 0, again
        assert "is stopped" not in again.stdout
        assert embedded.status().running
        assert url in "".join(again.stdout.split())  # rich wraps long lines
    finally:
        embedded.stop()
