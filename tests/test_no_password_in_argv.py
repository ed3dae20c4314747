"""A database password never reaches a command line: any local user reads those (`ps`,
/proc/PID/cmdline). Every process Courier starts, from `courier serve --workers` to the
bench's pgbench, gets the DSN through its environment instead (issue 40, item 4).

Trust authentication ignores a password, so a DSN with one still connects to the test server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from console.workers.supervisor import EmbeddedPool
from sqlkit.dsn import without_password
from tests.helpers import scalar
from tests.workers import COURIER, wait_for


def _secret() -> str:
    return "s3cr3t-" + uuid.uuid4().hex


def _with_password(dsn: str, password: str, form: str) -> str:
    """dsn with a password: as a keyword (password=...) or in a URL's user-info (user:password@)."""
    if form == "keyword":
        return make_conninfo(dsn, password=password)
    params = conninfo_to_dict(dsn)
    params.pop("password", None)
    user = quote(params.pop("user", "postgres"), safe="")
    dbname = quote(params.pop("dbname", "postgres"), safe="")
    host = params.pop("host", "")
    netloc = "" if host.startswith("/") else host
    if host.startswith("/"):
        params["host"] = host
    elif "port" in params:
        netloc += f":{params.pop('port')}"
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{user}:{quote(password, safe='')}@{netloc}/{dbname}{query}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("COURIER_DSN", "DATABASE_URL", "PGPASSWORD")}
    return {**env, **extra}


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    children = _children()
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _command_lines(pid: int) -> dict[int, str]:
    return {each: _cmdline(each) for each in _tree(pid)}


def _stop(process: subprocess.Popen, timeout: float = 40) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("workers, form", [(1, "keyword"), (2, "url")])
def test_serve_with_workers_keeps_a_password_from_the_environment_off_every_command_line(dsn, conn, workers, form):
    secret = _secret()
    secret_dsn = _with_password(dsn, secret, form)
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen([COURIER, "serve", "--listen", f"127.0.0.1:{free_port()}", "--workers", str(workers)],
                                  env=_clean_env(COURIER_DSN=secret_dsn), stdout=log, stderr=log, text=True)
        try:
            # serve, `courier worker`, and with 2 workers a pool process for each under it.
            processes = 2 if workers == 1 else 2 + workers
            wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.workers WHERE state = 'running'")
                     == workers and len(_tree(server.pid)) >= processes, timeout=60)
            lines = _command_lines(server.pid)
            assert len(lines) >= processes, lines
            assert any(" worker " in line for line in lines.values()), lines
            leaks = {pid: line for pid, line in lines.items() if secret in line}
            assert not leaks, f"the password is on these command lines: {leaks}"
        finally:
            _stop(server)
        log.seek(0)
        logged = log.read()
    assert secret not in logged


def test_the_console_worker_pool_gets_the_dsn_through_its_environment(dsn, conn):
    secret = _secret()
    pool = EmbeddedPool(_with_password(dsn, secret, "url"), concurrency=2, worker_id="argv-check")
    pool.start()
    try:
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.workers WHERE worker_id = 'argv-check' "
                                      "AND state = 'running'") == 1, timeout=30)
        pid = pool.state.pid
        assert pid is not None
        assert secret not in _cmdline(pid)
    finally:
        pool.stop(timeout=10)


def test_the_bench_server_gets_the_dsn_through_its_environment(dsn):
    from console.bench.http_api import ServeProcess

    secret = _secret()
    with tempfile.TemporaryFile("w+") as log:
        server = ServeProcess(_with_password(dsn, secret, "keyword"), log)
        try:
            server.wait_until_listening()
            lines = _command_lines(server.pid)
            assert all(secret not in line for line in lines.values()), lines
        finally:
            _stop(server)


@pytest.mark.parametrize("form", ["keyword", "url"])
def test_without_password_moves_the_password_out_of_the_conninfo(dsn, form):
    secret = _secret()
    conninfo, password = without_password(_with_password(dsn, secret, form))
    assert password == secret
    assert secret not in conninfo
    params = conninfo_to_dict(conninfo)
    assert "password" not in params
    assert params["dbname"] == conninfo_to_dict(dsn)["dbname"]
    assert without_password(dsn) == (make_conninfo(dsn), conninfo_to_dict(dsn).get("password") or None)
    assert without_password("") == ("", None)


def test_pgbench_gets_the_password_through_its_environment(dsn):
    from console.bench import pgbench

    secret = _secret()
    seen: dict[int, str] = {}
    done = threading.Event()

    def watch() -> None:  # pgbench's command line, while it runs
        while not done.is_set():
            for pid, line in _command_lines(os.getpid()).items():
                if "pgbench" in line:
                    seen[pid] = line
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run = pgbench.run_script(_with_password(dsn, secret, "url"), "SELECT pg_sleep(0.5);\n", clients=1,
                                 transactions=2)
    finally:
        done.set()
        watcher.join()
    assert run.transactions == 2
    assert seen, "pgbench was not seen running"
    assert all(secret not in line for line in seen.values()), seen


def test_the_spark_bench_jobs_take_the_dsn_from_their_environment(dsn, tmp_path):
    from console.bench import spark

    secret = _secret()
    secret_dsn = _with_password(dsn, secret, "url")
    for name, argv in spark._small_jobs(tmp_path).items():
        assert all(secret not in arg for arg in argv(0)), name
    # A job's CLI finds the database in the environment the bench runs it with.
    timed = spark._timed([sys.executable, "-c", spark.CLI, "db", "url"], spark._job_env(secret_dsn))
    assert timed.output.strip() == secret_dsn
