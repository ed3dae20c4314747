"""`courier demo --headless` as a user runs it: a real subprocess with its sink, producer and
worker child, in a database of its own beside the test database or on an embedded
PostgreSQL of its own, which never touches the database the user's other commands use."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from console.bench.scratch import with_dbname
from sqlkit import embedded
from tests.conftest import create_database, drop_database
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


def run_demo(args: list[str], env: dict[str, str], timeout: float = 90,
             during: Callable[[], None] | None = None) -> tuple[subprocess.CompletedProcess[str], set[int]]:
    """Run `courier demo ARGS`; return the result and every descendant seen while it ran.
    during, if given, is called every 0.2 s while the demo runs."""
    process = subprocess.Popen([str(COURIER), "demo", *args], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None and time.monotonic() < deadline:
            seen |= descendants(process.pid)
            if during is not None:
                during()
            time.sleep(0.2)
        out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), seen


def databases_named(server: str, name: str) -> list[str]:
    with psycopg.connect(server, autocommit=True) as admin:
        return [row[0] for row in admin.execute("SELECT datname FROM pg_database WHERE datname = %s", (name,))]


def courier_tables(dsn: str) -> int:
    """Tables in schema courier: 0 when nothing of Courier's was ever written there."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return scalar(conn, "SELECT count(*) FROM pg_tables WHERE schemaname = 'courier'")


@pytest.fixture
def demo_database(server_dsn: str) -> Iterator[str]:
    """A name for the demo's database on the test server, unique to the test (other runs may
    share the server), dropped afterwards whatever the demo left."""
    name = "courier_demo_t_" + uuid.uuid4().hex[:10]
    yield name
    drop_database(server_dsn, name)


def test_headless_demo_delivers_opens_a_circuit_and_leaves_nothing_behind(dsn, conn, server_dsn, demo_database,
                                                                         tmp_path):
    existed: list[bool] = []
    result, seen = run_demo(["--headless", "--seconds", "12", "--keep", "--database", demo_database, "--dsn", dsn],
                            demo_env(tmp_path), during=lambda: existed.append(bool(databases_named(server_dsn,
                                                                                                   demo_database))))
    assert result.returncode == 0, result
    assert "Traceback" not in result.stdout + result.stderr
    assert any(existed), "the demo's database exists while it runs"
    lines = [line for line in result.stdout.splitlines() if "delivered" in line]
    assert len(lines) >= 3 and lines[-1].startswith("stopped: "), result.stdout
    assert "demo-down=open" in result.stdout
    assert seen, "the worker pool runs as a child process"
    time.sleep(0.5)  # a reaper may lag behind the exit
    assert survivors(seen) == []
    # The database --dsn names is the template's clone: the demo wrote nothing into it.
    assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
    # --keep kept the demo's own database, with what it did.
    assert " ".join(result.stdout.split()).count(f"database {demo_database} is kept") == 1
    with psycopg.connect(with_dbname(server_dsn, demo_database), autocommit=True) as kept:
        circuits = dict(kept.execute("SELECT name, circuit_state FROM courier.endpoints").fetchall())
        assert circuits["demo-down"] == "open" and circuits["demo-healthy"] == "closed"
        assert scalar(kept, "SELECT count(*) FROM courier.archive a JOIN courier.endpoints e "
                            "ON e.id = a.endpoint_id WHERE e.name = 'demo-healthy' AND a.status = 'completed'") >= 50
        worker = kept.execute("SELECT worker_id, state, delivered FROM courier.workers").fetchall()
        assert len(worker) == 1 and worker[0][0].startswith("console:") and worker[0][1] == "stopped"
        assert scalar(kept, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 0
    assert (tmp_path / "demo-workers.log").read_text().count('"worker stopped"') == 1


def test_headless_demo_json_summary_and_its_database_dropped(dsn, conn, server_dsn, demo_database, tmp_path):
    result, _ = run_demo(["--headless", "--seconds", "1", "--rate", "20", "--json", "--dsn", dsn],
                         {**demo_env(tmp_path), "COURIER_DEMO_DATABASE": demo_database})
    assert result.returncode == 0, result
    summary = json.loads(result.stdout)  # the status lines went to stderr
    assert summary["worker_exit_code"] == 0 and summary["embedded_stopped"] is False
    assert set(summary["circuits"]) == {"demo-healthy", "demo-flaky", "demo-slow", "demo-down"}
    assert summary["database"] == demo_database and summary["database_dropped"] is True
    assert "delivered" in result.stderr
    assert databases_named(server_dsn, demo_database) == []
    assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 0


def test_demo_refuses_the_database_its_dsn_names(server_dsn, demo_database, tmp_path):
    """--dsn naming the demo's database would have the demo write into (and drop) the
    database the user named: refused in one line, and nothing is created or dropped."""
    target = create_database(server_dsn, demo_database)
    result, _ = run_demo(["--headless", "--seconds", "1", "--database", demo_database, "--dsn", target],
                         demo_env(tmp_path))
    assert result.returncode == 1, result
    assert result.stderr.strip().count("\n") == 0 and "the DSN names database" in result.stderr, result.stderr
    assert databases_named(server_dsn, demo_database) == [demo_database]
    assert courier_tables(target) == 0


@pytest.mark.timeout(240)
def test_demo_runs_in_its_own_embedded_database_and_stops_what_it_started(tmp_path, monkeypatch):
    """Starts a PostgreSQL of its own (initdb included): about 25 s. The demo works in
    courier_demo and leaves the default database `courier` as it found it (here: absent)."""
    env = demo_env(tmp_path)
    monkeypatch.setenv("COURIER_DATA_DIR", str(tmp_path))
    existed: list[bool] = []

    def demo_database_exists() -> None:
        server = embedded.database_url("postgres")
        if server is not None:
            with contextlib.suppress(psycopg.OperationalError):  # the server is starting or stopping
                existed.append(bool(databases_named(server, "courier_demo")))

    started, seen = run_demo(["--headless", "--seconds", "8"], env, during=demo_database_exists)
    assert started.returncode == 0, started
    shown = " ".join(started.stdout.split())
    assert "the embedded PostgreSQL this demo started is stopped" in shown
    assert "database courier_demo, the demo's own, is dropped" in shown
    assert any(existed), "courier_demo exists while the demo runs"
    assert not embedded.status().running
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()
    time.sleep(0.5)
    assert survivors(seen) == []
    # A server that was already running is left running; --keep keeps the demo's database.
    url = embedded.start()  # makes the default database, empty, as `courier db start` does
    try:
        server = embedded.database_url("postgres")
        assert server is not None
        assert databases_named(server, "courier_demo") == [], "dropped at exit"
        assert courier_tables(url) == 0, "the default database holds nothing of the demo's"
        again, _ = run_demo(["--headless", "--seconds", "2", "--keep"], env)
        assert again.returncode == 0, again
        assert "is stopped" not in again.stdout
        assert embedded.status().running
        demo_url = embedded.database_url("courier_demo")
        assert demo_url is not None and demo_url in "".join(again.stdout.split())  # rich wraps long lines
        with psycopg.connect(demo_url, autocommit=True) as kept:
            first = kept.execute("SELECT name, id FROM courier.endpoints ORDER BY name").fetchall()
        assert [name for name, _ in first] == ["demo-down", "demo-flaky", "demo-healthy", "demo-slow"]
        assert courier_tables(url) == 0
        # --keep again carries on with the kept database; without it, the demo starts afresh and drops it.
        carried, _ = run_demo(["--headless", "--seconds", "1", "--keep"], env)
        assert carried.returncode == 0, carried
        with psycopg.connect(demo_url, autocommit=True) as kept:
            assert kept.execute("SELECT name, id FROM courier.endpoints ORDER BY name").fetchall() == first
        fresh, _ = run_demo(["--headless", "--seconds", "1"], env)
        assert fresh.returncode == 0, fresh
        assert databases_named(server, "courier_demo") == []
        assert courier_tables(url) == 0
    finally:
        embedded.stop()
