"""Scale-out for real: a standalone Spark master and worker from the pyspark distribution on
loopback, and `courier pipeline analytics --master spark://...` run as a user would, giving
the same results as local mode. Also: without Java, the pipeline says so in one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_pipeline import archive_dsn, seed_archive, spark  # noqa: F401 - shared fixtures

pyspark = pytest.importorskip("pyspark")

COURIER = [str(Path(sys.executable).with_name("courier"))]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _spark_env() -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent), "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}


def _wait_for(log: Path, text: str, process: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{text!r} never appeared in {log}:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[str]:
    """One master and one single-core worker, both on 127.0.0.1."""
    folder = tmp_path_factory.mktemp("spark-cluster")
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    port = _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    started = []
    try:
        master_log = folder / "master.log"
        master = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(_free_port())],
            env=_spark_env(), stdout=master_log.open("wb"), stderr=subprocess.STDOUT)
        started.append(master)
        _wait_for(master_log, "I have been elected leader", master)
        worker_log = folder / "worker.log"
        worker = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
             "--memory", "2g", "--webui-port", str(_free_port()), "--work-dir", str(folder / "work"), master_url],
            env=_spark_env(), stdout=worker_log.open("wb"), stderr=subprocess.STDOUT)
        started.append(worker)
        _wait_for(worker_log, "Successfully registered with master", worker)
        yield master_url
    finally:
        for process in reversed(started):
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def test_analytics_on_a_standalone_cluster_equal_local_mode(spark, archive_dsn, conn, cluster):  # noqa: F811
    from console.pipeline import analytics

    local = analytics.run(spark, archive_dsn, None)
    local_rows = sorted(conn.execute("SELECT endpoint_id, hour, delivered, failed, expired, dead_lettered, "
                                     "p50_ms, p95_ms, p99_ms FROM courier.analytics_hourly").fetchall())
    conn.execute("TRUNCATE courier.analytics_hourly, courier.analytics_attempts, courier.analytics_errors")

    ran = subprocess.run([*COURIER, "pipeline", "analytics", "--dsn", archive_dsn, "--master", cluster, "--json"],
                         env={**_spark_env(), "COURIER_PIPELINE_TINY_ROWS": "0"},  # 3,000 rows: SQL would do them
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads(ran.stdout)
    assert summary == [{"endpoint": e.endpoint, "delivered": e.delivered, "failed": e.failed, "expired": e.expired,
                        "dead_lettered": e.dead_lettered, "p50_ms": e.p50_ms, "p95_ms": e.p95_ms,
                        "p99_ms": e.p99_ms} for e in local.endpoints]
    assert sorted(conn.execute("SELECT endpoint_id, hour, delivered, failed, expired, dead_lettered, "
                               "p50_ms, p95_ms, p99_ms FROM courier.analytics_hourly").fetchall()) == local_rows
    assert conn.execute("SELECT master FROM courier.analytics_runs ORDER BY id DESC LIMIT 1").fetchone()[0] == cluster
    assert "WARN" not in ran.stderr and "INFO" not in ran.stderr  # Spark's log stays in its log file


def test_without_java_one_clear_line(archive_dsn, tmp_path):  # noqa: F811
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # the venv's courier, and no java
    env["COURIER_PIPELINE_TINY_ROWS"] = "0"  # a job that needs Spark (an empty or tiny one needs no Java)
    ran = subprocess.run([*COURIER, "pipeline", "analytics", "--dsn", archive_dsn], env=env, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 1
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, ran.stderr
    assert "Java was not found" in lines[0] and "JAVA_HOME" in lines[0] and "Traceback" not in ran.stderr
