"""`courier bench pull` runs end to end on a small topic: every path drains it all."""

from __future__ import annotations

from console.bench.pull import pull
from tests.helpers import scalar


def test_bench_pull_drains_the_topic_through_sql_and_the_consumer(dsn, conn):
    results = pull(dsn, clients=2, seconds=1, rounds=1, messages=2_000)
    assert [r.variant.split(",")[0] for r in results] == [
        "reference: bare leased claim + delete", "SQL dequeue(100) + ack", "Python consumer"]
    assert all(r.courier.rate > 0 and r.ceiling.rate > 0 for r in results)
    assert [r.target_ratio for r in results] == [None, 0.8, 0.5]
    # The last run (the consumer's) acked every message: none left, none in the DLQ.
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status <> 'completed'") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0
