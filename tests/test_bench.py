"""`courier bench enqueue-single` and `enqueue-batch` run end to end, sending as a user's
defaults do (the backpressure check stays on); a bench whose worker fails says why."""

from __future__ import annotations

import tempfile

from console.bench.drain import WorkerProcess
from console.bench.enqueue import enqueue_batch, enqueue_single
from console.bench.scratch import with_dbname
from tests.helpers import scalar


def test_bench_enqueue_sends_through_the_default_backpressure_check(dsn, conn):
    single = enqueue_single(dsn, clients=2, seconds=1, rounds=1)
    batch = enqueue_batch(dsn, clients=2, seconds=1, rounds=1)
    assert [r.variant for r in single] == ["send, 2 clients", "send, notify off, 2 clients",
                                           "queue table only, 2 clients"]
    assert [r.variant for r in batch] == ["batch 100, 2 clients", "batch 1000, 2 clients"]
    assert all(r.courier.rate > 0 and r.ceiling.rate > 0 for r in single + batch)
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
