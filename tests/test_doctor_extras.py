"""`courier doctor`, and what a user sees when an optional part (an extra) is not installed.

An install without an extra is shown by starting the CLI with that package's import blocked
(sys.modules[name] = None makes both `import` and importlib.util.find_spec miss it), so each
case runs the real command against the real test database.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from importlib import metadata

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.test_cli import ENV, run

BLOCKED_CLI = ("import sys\n"
               "for name in sys.argv[1].split(','):\n"
               "    sys.modules[name] = None\n"
               "sys.argv = ['courier', *sys.argv[2:]]\n"
               "from console.cli import main\n"
               "main()\n")


def run_without(modules: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKED_CLI, modules, *args], capture_output=True, text=True,
                          env=ENV, timeout=120)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def lines(output: str) -> dict[str, str]:
    """`courier doctor`'s lines by check name: {"database schema": "ok  database schema  ..."}."""
    found = {}
    for line in output.splitlines():
        columns = re.split(r"\s{2,}", line.strip(), maxsplit=2)
        if len(columns) == 3 and columns[0] in ("ok", "warn", "FAIL", "skip"):
            found[columns[1]] = line
    return found


def test_doctor_on_a_current_database_passes_and_says_what_it_checked(dsn: str) -> None:
    done = run("doctor", dsn=dsn)
    assert done.code == 0, done.out + done.err
    checks = lines(done.out)
    assert checks["database reachable"].startswith("  ok")
    assert checks["database schema"].startswith("  ok") and "migrations current" in checks["database schema"]
    assert checks["database roles"].startswith("  ok")
    assert checks["courier version"].startswith("  ok")
    assert "pipeline spark" in checks and "pipeline java" in checks
    assert "Traceback" not in done.err

    as_json = run("doctor", "--json", dsn=dsn).json()
    assert as_json["ok"] is True
    by_name = {(c["area"], c["name"]): c for c in as_json["checks"]}
    assert by_name["database", "schema"]["status"] == "ok"


def test_doctor_names_the_fix_for_a_database_without_the_schema(empty_dsn: str) -> None:
    done = run("doctor", dsn=empty_dsn)
    assert done.code == 1
    schema = lines(done.out)["database schema"]
    assert schema.startswith("FAIL") and "not installed" in schema
    assert "fix: Run `courier migrate`" in done.out


def test_doctor_reports_an_unreachable_database_in_one_line() -> None:
    done = run("doctor", dsn=f"postgresql://postgres@127.0.0.1:{closed_port()}/nowhere")
    assert done.code == 1
    assert lines(done.out)["database reachable"].startswith("FAIL")
    assert "Traceback" not in done.out + done.err


def test_doctor_checks_each_broker_address_without_showing_credentials(dsn: str) -> None:
    listening = socket.create_server(("127.0.0.1", 0))
    up, down = listening.getsockname()[1], closed_port()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name, port in (("up", up), ("down", down)):
                conn.execute("SELECT courier.create_endpoint(%s, 'redis', %s)",
                             [name, json.dumps({"url": f"redis://user:hunter2@127.0.0.1:{port}/0",
                                                "stream": "s", "allow_internal": True})])
        done = run("doctor", dsn=dsn)
    finally:
        listening.close()
    assert done.code == 1
    checks = lines(done.out)
    assert checks[f"brokers redis 127.0.0.1:{up}"].startswith("  ok")
    failed = checks[f"brokers redis 127.0.0.1:{down}"]
    assert failed.startswith("FAIL") and "not reachable" in failed and "used by down" in failed
    assert "hunter2" not in done.out + done.err


def test_a_missing_broker_client_is_named_with_its_extra(dsn: str) -> None:
    created = run_without("redis", "endpoint", "create", "orders", "redis",
                          '{"url": "redis://127.0.0.1:6379/0", "stream": "s", "allow_internal": true}', "--dsn", dsn)
    assert created.returncode == 0, created.stderr
    assert "created endpoint orders" in created.stdout
    assert "warning:" in created.stderr and "pip install 'courier[redis]'" in created.stderr

    doctor = run_without("redis", "doctor", "--dsn", dsn)
    assert doctor.returncode == 1
    client = lines(doctor.stdout)["brokers redis client"]
    assert client.startswith("FAIL") and "used by orders" in client
    assert "fix: pip install 'courier[redis]'" in doctor.stdout

    bench = run_without("nats", "bench", "dispatch-nats", "--dsn", dsn)
    assert bench.returncode == 1
    assert bench.stderr.strip().splitlines() == [
        "error: courier bench dispatch-nats needs nats, which is not installed. Hint: pip install 'courier[nats]'"]


def test_doctor_skips_spark_when_its_extra_is_missing(dsn: str) -> None:
    done = run_without("pyspark", "doctor", "--dsn", dsn)
    spark = lines(done.stdout)["pipeline spark"]
    assert spark.startswith("skip") and "pip install 'courier[spark]'" in done.stdout
    assert "pipeline java" not in lines(done.stdout)


def test_a_worker_without_the_extra_leaves_the_endpoint_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    from console.workers.dispatchers import dispatcher_for

    monkeypatch.setitem(sys.modules, "aio_pika", None)
    assert dispatcher_for("amqp", {}) is None  # the pool claims nothing for an endpoint without a dispatcher
    assert dispatcher_for("noop", {}) is not None


def test_the_core_install_requires_no_spark_or_broker_client() -> None:
    optional = {"pyspark", "pyarrow", "redis", "aio-pika", "aiomqtt", "paho-mqtt", "nats-py"}
    for requirement in metadata.requires("courier") or []:
        name = requirement.split(";")[0].split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()
        if name in optional:
            assert "extra ==" in requirement, f"{requirement} must be in an extra, not the core"


def test_endpoint_create_and_doctor_know_what_the_running_workers_can_deliver(dsn: str) -> None:
    """A worker reports the protocols its install can deliver; an endpoint none of the running
    workers could deliver is flagged at once, even where the CLI's own install has the extra."""
    worker = subprocess.Popen([sys.executable, "-c", BLOCKED_CLI, "redis", "worker", "--processes", "1",
                               "--worker-id", "no-redis", "--dsn", dsn],
                              env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = conn.execute("SELECT protocols FROM courier.workers WHERE worker_id = 'no-redis'").fetchone()
                if row and row[0]:
                    break
                time.sleep(0.2)
            assert row and row[0] == ["http", "noop", "amqp", "mqtt", "nats"], row

        created = run("endpoint", "create", "stream", "redis",
                      '{"url": "redis://127.0.0.1:6379/0", "stream": "s", "allow_internal": true}', dsn=dsn)
        assert created.code == 0
        assert "warning: none of the 1 running worker(s) can deliver to redis endpoints" in created.err
        assert "pip install 'courier[redis]'" in created.err
        quiet = run("endpoint", "create", "jobs", "nats",
                    '{"url": "nats://127.0.0.1:4222", "subject": "s", "allow_internal": true}', dsn=dsn)
        assert quiet.code == 0 and "warning" not in quiet.err

        checks = lines(run("doctor", dsn=dsn).out)
        assert checks["brokers redis workers"].startswith("FAIL")
        assert checks["brokers nats workers"].startswith("  ok") and "1 of 1 running" in checks["brokers nats workers"]
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=60)


@pytest.mark.parametrize("group", ["courier_monitor", "courier_application"])
def test_doctor_as_a_least_privileged_role_skips_what_it_may_not_read(dsn: str, conn: psycopg.Connection,
                                                                       group: str) -> None:
    """Run as a monitoring or application login, doctor says what it could not check and why,
    never reads an endpoint's URL (its credentials), and fails nothing for lack of rights."""
    conn.execute("SELECT courier.create_endpoint('stream', 'redis', %s)",
                 [json.dumps({"url": "redis://user:hunter2@127.0.0.1:6379/0", "stream": "s", "allow_internal": True})])
    name = f"courier_doctor_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(sql.Identifier(name), sql.Identifier(group)))
    try:
        params = conninfo_to_dict(dsn)
        params.pop("password", None)
        done = run("doctor", dsn=make_conninfo("", **{**params, "user": name}))
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
    assert done.code == 0, done.out + done.err
    checks = lines(done.out)
    assert checks["database connected role"].startswith("  ok") and group in checks["database connected role"]
    assert "hunter2" not in done.out and "Traceback" not in done.err
    if group == "courier_monitor":
        assert checks["database schema"].startswith("  ok")
        assert checks["brokers addresses"].startswith("skip")
        assert "cannot read the endpoints' URLs" in checks["brokers addresses"]
    else:
        assert checks["database schema"].startswith("skip") and "cannot read the migration history" in done.out
        assert checks["brokers endpoints"].startswith("skip")
    assert "skipped" in done.out.splitlines()[-1]
