"""`courier bench enqueue-single` and `enqueue-batch` run end to end, sending as a user's
defaults do (the backpressure check stays on); a bench whose worker fails says why."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

from console.bench import cpu
from console.bench.brokers import dispatch_redis
from console.bench.drain import WorkerProcess, drain_noop
from console.bench.enqueue import enqueue_batch, enqueue_single
from console.bench.scratch import with_dbname
from tests.brokers import require_broker
from tests.helpers import scalar


def test_bench_enqueue_sends_through_the_default_backpressure_check(dsn, conn):
    single = enqueue_single(dsn, clients=2, seconds=1, rounds=1)
    batch = enqueue_batch(dsn, clients=2, seconds=1, rounds=1)
    assert [r.variant for r in single] == ["send, 2 clients", "send, notify off, 2 clients",
                                           "send to a pull topic, 2 clients", "queue table only, 2 clients",
                                           "send vs pgmq send, 2 clients", "send vs pgmq send, drained, 2 clients",
                                           "enqueue vs pgmq send, drained, 2 clients"]
    assert [r.variant for r in batch] == ["batch 100, 2 clients", "batch 100 vs pgmq send_batch, 2 clients",
                                          "batch 1000, 2 clients", "batch 1000 vs pgmq send_batch, 2 clients"]
    assert all(r.courier.rate > 0 and r.ceiling.rate > 0 for r in single + batch)
    # Beside the bare INSERT, pgmq's send of the same payloads, measured in the same rounds.
    assert single[4].courier is single[0].courier and batch[1].courier is batch[0].courier
    assert all("pgmq 1." in r.notes for r in (single[4], batch[1], batch[3]))
    # And both while a consumer drains them: `courier worker` as shipped, pgmq's read + delete.
    assert "`courier worker` with no flags" in single[5].notes and single[5].courier is not single[0].courier
    # A pull topic's enqueues beside the same pgmq run, drained by a consumer's dequeue and ack.
    assert "dequeues 100 and acks" in single[6].notes and single[6].ceiling is single[5].ceiling
    # Raised out of reach, not switched off (0): a send still sums the depth counters.
    assert scalar(conn, "SELECT value FROM courier.settings WHERE name = 'max_queue_size'") == "2147483647"
    # The last run's messages are all there, counted.
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == scalar(
        conn, "SELECT sum(messages) FROM courier.queue_depth WHERE status = 'pending'") > 0


def test_a_bench_whose_worker_fails_says_why_in_one_line(server_dsn):
    """A worker that could not run its scenario is reported with its exit and its last log
    line, not as a bare "did not drain" traceback."""
    with tempfile.TemporaryFile("w+") as log:
        worker = WorkerProcess(with_dbname(server_dsn, "courier_no_such_database"), log)
        assert worker.wait(60) == 1
        message = worker.failure("the worker did not drain the queue").one_line()
    assert message.startswith("the worker did not drain the queue: `courier worker` exited with code 1; "
                              "its last log line: error: cannot connect to PostgreSQL")
    assert "courier_no_such_database" in message and "\n" not in message


def test_drain_noop_scales_over_worker_processes_and_says_what_a_thousand_messages_cost(dsn, conn):
    """`courier bench drain-noop --processes 1,2`: one point per process count, each against the
    ceiling with as many pgbench clients, and the CPU the worker and the database spent."""
    results = drain_noop(dsn, clients=2, seconds=1, rounds=1, messages=5_000, processes=(1, 2))
    assert [r.variant for r in results] == ["5,000 msgs, `courier worker` defaults", "--processes 1, 5,000 msgs",
                                            "--processes 2, 5,000 msgs"]
    assert all(r.courier.rate > 0 and r.ceiling.rate > 0 for r in results)
    for result in results:
        worker, database = re.search(r"worker ([\d.]+|n/a), database ([\d.]+|n/a)", result.notes).groups()
        assert float(worker) > 0  # the worker runs here, so /proc always tells
        if scalar(conn, "SELECT inet_server_addr() IS NULL OR host(inet_server_addr()) IN ('127.0.0.1', '::1')"):
            assert database != "n/a" and float(database) > 0
    assert "of the curve's peak" in results[1].notes


def test_cpu_seconds_of_a_process_tree():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                             "while time.process_time() < end: pass\ntime.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while (cpu.tree_seconds(busy.pid) or 0) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cpu.tree_seconds(busy.pid) >= 0.4  # the child's own
        assert cpu.tree_seconds(os.getpid()) >= cpu.tree_seconds(busy.pid)  # and under its parent
    finally:
        busy.kill()
        busy.wait()
    assert cpu.tree_seconds(2 ** 22 + 12345) is None  # no such process


def test_bench_dispatch_redis_runs_the_default_worker_against_the_plain_client(dsn, conn):
    """The broker benches run `courier worker` as shipped (its own processes, timed from the
    first delivery), report its CPU cost, and keep the one-pool figure they measured before."""
    require_broker("redis")
    result = dispatch_redis(dsn, clients=2, seconds=1, rounds=1, messages=400)
    assert result.variant == "400 msgs, `courier worker` defaults"
    assert result.courier.rate > 0 and result.ceiling.rate > 0 and result.target_ratio == 0.7
    assert re.search(r"CPU-seconds per 1,000 messages: worker \d+\.\d{3}, database (\d+\.\d{3}|n/a)", result.notes)
    assert re.search(r"one pool in the bench's process claiming 100 at a time .* drained [\d,]+ msg/s", result.notes)
    # Every message of every run was delivered and archived: nothing is left in the queue.
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0
