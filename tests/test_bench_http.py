"""`courier bench http` runs end to end at a tiny size: it starts `courier serve` on the test's
database, measures every figure against the SQL path beside it, and stops the server after."""

from __future__ import annotations

import re
import time

import pytest

from console.bench.http_api import http, serve_process
from console.bench.scratch import with_dbname
from sqlkit.errors import CourierError
from tests.helpers import scalar


def test_bench_http_measures_the_server_against_the_sql_path(dsn, conn):
    results = http(dsn, clients=2, seconds=1, rounds=1, messages=2_000, rate=200)
    assert [r.variant for r in results[:3]] == [
        "enqueue, batch 1, 2 clients", "enqueue, batch 100, 2 clients", "dequeue(100) + ack, 2 clients"]
    assert re.fullmatch(r"enqueue p99 [0-9.,]+ ms at 200/s offered \([0-9,]+/s answered\)", results[3].variant)
    assert all(r.scenario == "http" and "courier serve" in r.notes for r in results)
    for throughput in results[:3]:
        assert throughput.courier.rate > 0 and throughput.ceiling.rate > 0
        assert throughput.target_ratio == 0.5 and throughput.ratio > 0
    latency = results[3]
    assert latency.ceiling is None and latency.target_absolute == 100
    assert latency.courier.rate > 0 and latency.courier.latency_ms > 0
    assert "HTTP p99" in latency.notes and "through SQL" in latency.notes
    # The server was stopped (its connections to this database are gone) and the topic left empty.
    deadline = time.monotonic() + 10
    while scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND application_name = 'courier-serve'") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name = 'courier-serve'") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_a_server_that_cannot_start_is_reported_with_its_last_log_line(server_dsn):
    with pytest.raises(CourierError) as raised, serve_process(with_dbname(server_dsn, "courier_no_such_database")):
        pass
    message = raised.value.one_line()
    assert message.startswith("`courier serve` did not start: `courier serve` exited with code ")
    assert "courier_no_such_database" in message
