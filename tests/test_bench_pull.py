"""`courier bench pull` runs end to end on a small topic: every path drains it all."""

from __future__ import annotations

from console.bench.pull import pull
from tests.helpers import scalar


def test_bench_pull_drains_the_topic_through_sql_and_the_consumer(dsn, conn):
    results = pull(dsn, clients=2, seconds=1, rounds=1, messages=2_000)
    assert [r.variant.split(",")[0] for r in results] == [
        "SQL dequeue(10) + ack", "Python Consumer", "SQL dequeue(100) + ack", "Python Consumer",
        "SQL receive(100)", "Python ReceiveLoop"]
    assert all(r.courier.rate > 0 and r.ceiling.rate > 0 for r in results)
    assert [r.target_ratio for r in results] == [0.95, 0.7, 0.95, 0.7, 0.95, 0.6]
    # Each dequeue+ack line is held to the leased ceiling of its own batch size, receive to the
    # single DELETE; the single DELETE's figure is named in the dequeue lines' notes.
    assert results[0].ceiling is results[1].ceiling and results[2].ceiling is results[3].ceiling
    assert results[0].ceiling is not results[2].ceiling and results[4].ceiling is not results[0].ceiling
    assert "single DELETE" in results[0].notes
    # The last run (the ReceiveLoop's) took every message: none left, none in the DLQ.
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status IN ('pending', 'processing')") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0
