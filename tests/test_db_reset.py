"""`courier db reset` as a user runs it: a real subprocess that empties the embedded default
database (on an embedded PostgreSQL of the test's own), asks first, and leaves any other
server alone unless told to act on it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest

from sqlkit import embedded, migrate
from tests.helpers import scalar
from tests.test_cli import COURIER, ENV, HOOK, Result, assert_ok, assert_one_line_error


def courier(*args: str, data_dir: Path, stdin: int | None = subprocess.DEVNULL) -> Result:
    """`courier ARGS` with no database configured but the embedded one in data_dir, and
    stdin that is not a terminal (as in a script or CI)."""
    done = subprocess.run([str(COURIER), *args], stdin=stdin, capture_output=True, text=True,
                          env={**ENV, "COURIER_DATA_DIR": str(data_dir)}, timeout=120)
    return Result(done.returncode, done.stdout, done.stderr)


def endpoints(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [name for (name,) in conn.execute("SELECT name FROM courier.endpoints ORDER BY name")]


@pytest.mark.timeout(180)
def test_reset_empties_the_embedded_default_database_and_asks_first(tmp_path, monkeypatch):
    """Starts a PostgreSQL of its own (initdb included): about 15 s."""
    monkeypatch.setenv("COURIER_DATA_DIR", str(tmp_path))
    nothing = assert_ok(courier("db", "reset", "--yes", data_dir=tmp_path))
    assert "nothing to reset" in nothing.out and not embedded.status().running
    assert_ok(courier("db", "start", data_dir=tmp_path))
    try:
        url = embedded.url()
        assert url is not None
        assert_ok(courier("migrate", data_dir=tmp_path))
        assert_ok(courier("endpoint", "create", "billing", "http", HOOK, data_dir=tmp_path))
        assert_ok(courier("send", "billing", '{"order": 1}', data_dir=tmp_path))

        # No terminal to ask on and no --yes: one line, a nonzero exit, and nothing deleted.
        refused = courier("db", "reset", data_dir=tmp_path)
        assert_one_line_error(refused, "no terminal to ask on", "--yes")
        assert endpoints(url) == ["billing"]

        # A session on the database (a worker, say): refused, naming it, and nothing deleted.
        with psycopg.connect(url, autocommit=True) as squatter:
            busy = courier("db", "reset", "--yes", data_dir=tmp_path)
            pid = squatter.info.backend_pid
        assert_one_line_error(busy, "connected to database courier", str(pid))
        assert endpoints(url) == ["billing"]

        done = assert_ok(courier("db", "reset", "--yes", data_dir=tmp_path))
        assert "database courier emptied" in done.text and str(tmp_path / "pgdata") in done.out.replace("\n", "")
        assert endpoints(url) == []
        with psycopg.connect(url, autocommit=True) as conn:
            assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
            # Installed afresh, ready for the next command as after `courier migrate`.
            assert migrate.status(conn).installed_version >= migrate.BASELINE_VERSION
        assert embedded.status().running, "a server that was running is left running"
    finally:
        embedded.stop()
    # A stopped server is started for the reset and stopped again.
    again = assert_ok(courier("db", "reset", "--yes", "--json", data_dir=tmp_path)).json()
    assert again["reset"] is True and again["embedded_stopped"] is True
    assert not embedded.status().running


def test_reset_refuses_a_configured_server_unless_told(dsn, conn, tmp_path):
    conn.execute("SELECT courier.create_endpoint('billing', 'http', %s::jsonb)", (HOOK,))
    conn.execute("CREATE TABLE public.mine (x int)")
    refused = courier("db", "reset", "--yes", "--dsn", dsn, data_dir=tmp_path)
    assert_one_line_error(refused, "another server", "--external")
    assert endpoints(dsn) == ["billing"]
    # Told: schema courier is dropped and installed afresh; the database and the rest of it stay.
    done = assert_ok(courier("db", "reset", "--yes", "--external", "--dsn", dsn, data_dir=tmp_path))
    assert "emptied" in done.out
    assert endpoints(dsn) == []
    assert scalar(conn, "SELECT count(*) FROM public.mine") == 0
    assert not (tmp_path / "pgdata").exists(), "the embedded PostgreSQL was never started"


def test_db_help_says_where_the_data_lives_and_how_to_remove_it(tmp_path):
    shown = assert_ok(courier("db", "--help", data_dir=tmp_path))
    text = " ".join(shown.out.split())
    assert f"{tmp_path / 'pgdata'}" in shown.out.replace("\n", "")
    assert "courier db reset" in text and "courier db stop" in text and "delete" in text
