"""`courier bench enqueue-single` and `enqueue-batch` run end to end, sending as a user's
defaults do: the backpressure check stays on."""

from __future__ import annotations

from console.bench.enqueue import enqueue_batch, enqueue_single
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
