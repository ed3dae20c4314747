"""`courier bench pull` runs end to end on a small topic: every path drains it all, Courier's and
pgmq's."""

from __future__ import annotations

import sys

from console.bench.pull import pull
from tests.helpers import scalar


def test_bench_pull_drains_the_topic_through_sql_and_the_consumer(dsn, conn):
    results = pull(dsn, clients=2, seconds=1, rounds=1, messages=2_000)
    assert [r.variant.split(",")[0] for r in results] == [
        "SQL dequeue(10) + ack", "SQL dequeue(10) + ack vs pgmq read(10) + delete",
        "SQL ack + dequeue(10) in one statement", "Python Consumer",
        "Python Consumer vs a psycopg loop of pgmq read(10) + delete",
        "SQL dequeue(100) + ack", "SQL dequeue(100) + ack vs pgmq read(100) + delete",
        "SQL ack + dequeue(100) in one statement", "Python Consumer",
        "Python Consumer vs a psycopg loop of pgmq read(100) + delete",
        "SQL receive(100)", "SQL receive(100) vs pgmq pop(100)", "SQL receive(1) vs pgmq pop(1)",
        "Python ReceiveLoop"]
    assert all(r.courier.rate > 0 and r.ceiling.rate > 0 for r in results)
    assert [r.target_ratio for r in results] == [0.95, 0.95, 0.95, 0.7, 1.0] * 2 + [0.95, 0.95, 0.95, 0.6]
    # Each dequeue+ack line, however it groups its statements, is held to the leased ceiling of
    # its own batch size, receive to the single DELETE; the single DELETE's figure is named in
    # the dequeue lines' notes.
    assert results[0].ceiling is results[2].ceiling is results[3].ceiling
    assert results[5].ceiling is results[7].ceiling is results[8].ceiling
    assert results[0].ceiling is not results[5].ceiling and results[10].ceiling is not results[0].ceiling
    assert "single DELETE" in results[0].notes
    # Beside them, the same SQL path against pgmq's: the same Courier figure, pgmq's as the other.
    for courier_line, pgmq_line in ((0, 1), (5, 6), (10, 11)):
        assert results[pgmq_line].courier is results[courier_line].courier
        assert results[pgmq_line].ceiling is not results[courier_line].ceiling
        assert "pgmq 1." in results[pgmq_line].notes
    # The Consumer beside the loop a pgmq user writes with psycopg, at the same batch size.
    for consumer_line, loop_line in ((3, 4), (8, 9)):
        assert results[loop_line].courier is results[consumer_line].courier
        assert "psycopg" in results[loop_line].notes and "pgmq 1." in results[loop_line].notes
    # pgmq drained its queue too, every time.
    assert scalar(conn, "SELECT count(*) FROM pgmq.q_bench") == 0
    # The last run (the ReceiveLoop's) took every message: none left, none in the DLQ.
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status IN ('pending', 'processing')") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.dlq") == 0


def test_without_pgmq_the_bench_leaves_its_rows_out_and_says_how_to_get_them(dsn, monkeypatch):
    monkeypatch.setitem(sys.modules, "pgmq", None)  # as if the peers extra were not installed
    results = pull(dsn, clients=2, seconds=1, rounds=1, messages=1_000)
    assert not any("pgmq" in r.variant for r in results)
    assert "pgmq's rows left out: pip install 'courier[peers]'" in results[6].notes
    assert all(r.courier.rate > 0 and r.ceiling.rate > 0 for r in results)
