"""`courier bench cost` and `horizon` run end to end beside pgmq in one scratch database."""

from __future__ import annotations

import dataclasses

import pytest

from console.bench import cost as cost_scenario
from console.bench import instructions, pgmq, pgq
from console.bench.cost import cost
from console.bench.horizon import horizon
from sqlkit.connection import connect


def test_bench_cost_counts_each_operation_beside_pgmq(dsn):
    results = {r.variant: r for r in cost(dsn, instructions=False)}  # counted below, in a test of their own
    for operation in ("send", "send to a pull topic", "enqueue (pull topic)", "send_batch of 100",
                      "enqueue_batch of 100", "dequeue(1) + ack", "dequeue(10) + ack", "dequeue(100) + ack",
                      "dequeue(1) + nack", "dequeue(1) + release", "dequeue(1) + extend + ack",
                      "push: send + claim(10) + report", "push: claim(100) + report of a backlog",
                      "pull: enqueue + dequeue(10) + ack",
                      "pull: enqueue + receive(10)", "receive(1)", "receive(100)"):
        wal = results[f"{operation}: WAL bytes/msg"]
        assert wal.lower_is_better and wal.target_ratio == 1.0
        assert wal.courier.rate > 0 and wal.ceiling.rate > 0
        assert results[f"{operation}: shared buffers/msg"].courier.rate > 0
    # Deterministic, whatever the machine: a send, staged as a running worker's leader lets it
    # (migration 0054), writes its row and one index entry, pgmq's its row and two (and now and
    # then a page split); nothing for a depth counter. So does a send or an enqueue to a pull
    # topic, whose next dequeue or receive takes it from the stage.
    for operation in ("send", "send to a pull topic", "enqueue (pull topic)"):
        records = results[f"{operation}: WAL records/msg"]
        assert round(records.courier.rate) == 2 and round(records.ceiling.rate) == 3, operation
    # A pull message received from the stage is never written to the queue: its life writes
    # fewer records than pgmq's send and pop.
    records = results["pull: enqueue + receive(10): WAL records/msg"]
    assert records.courier.rate < records.ceiling.rate
    # A push message's life: its staged row and index entry (2); the claim's lock and delete of it
    # there, and its queue row and two index entries, written once, claimed (5); the report's
    # delete of it and its archive row and two index entries (4). A claim that moved the message
    # pending and then updated it wrote three more.
    records = results["push: send + claim(10) + report: WAL records/msg"]
    assert records.courier.rate < 12.5  # 11.2 on PostgreSQL 15; 14.3 with the move and the update
    # receive(1) deletes the row as pop does; its outcome counter writes no WAL either.
    records = results["receive(1): WAL records/msg"]
    assert records.courier.rate <= records.ceiling.rate
    assert not any(variant.endswith("instructions/msg") for variant in results)


def test_bench_cost_settles_take_and_settle_one_message_a_unit(dsn):
    """Every unit of the settle rows leases one message of its own and settles it: a nacked or
    released message is due again behind the preload, so none is nacked twice (nor dead-lettered),
    and pgmq's read takes the message set visible again each time."""
    cost_scenario._prepare(dsn)
    named = {operation.name: operation for operation in cost_scenario.OPERATIONS}
    taken = named["dequeue(1) + nack"].units + cost_scenario.WARMUP_UNITS

    def courier_after(name: str) -> list[tuple]:
        cost_scenario.measure(dsn, named[name], "courier")
        with connect(dsn) as conn:
            return conn.execute("SELECT status, retry_count, lease <> 0, count(*) FROM courier.queue "
                                "GROUP BY 1, 2, 3").fetchall()

    def pgmq_after(name: str) -> list[tuple]:
        cost_scenario.measure(dsn, named[name], "pgmq")
        with connect(dsn) as conn:
            return conn.execute(f"SELECT read_ct, count(*) FROM pgmq.q_{pgmq.QUEUE} GROUP BY 1 ORDER BY 1").fetchall()

    assert courier_after("dequeue(1) + nack") == [("pending", 1, True, taken)]
    assert courier_after("dequeue(1) + release") == [("pending", 0, True, taken)]
    assert courier_after("dequeue(1) + extend + ack") == []
    with connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM courier.dlq").fetchone()[0] == 0
    assert pgmq_after("dequeue(1) + nack") == [(0, taken - 1), (taken, 1)]
    assert pgmq_after("dequeue(1) + release") == [(0, taken - 1), (taken, 1)]
    assert pgmq_after("dequeue(1) + extend + ack") == []


def test_bench_cost_puts_pgq_beside_them_where_the_server_has_it(dsn):
    with connect(dsn) as conn:
        if not pgq.available(conn):
            pytest.skip("this PostgreSQL has no PgQ extension (Debian: postgresql-NN-pgq3)")
    results = {r.variant: r for r in cost(dsn, instructions=False)}

    def pgq_figure(variant: str) -> float:
        note = results[variant].notes
        assert "PgQ (" in note
        return float(note.rsplit(": ", 1)[1].replace(",", ""))

    # An event is its row and one index entry (the transaction id): two WAL records, against three.
    assert pgq_figure("send: WAL records/msg") == pytest.approx(2.0, abs=0.1)
    # A consumer that takes a tick's batch of 100 writes almost nothing per event.
    assert pgq_figure("receive(100): WAL bytes/msg") < 20
    assert pgq_figure("dequeue(100) + ack: WAL bytes/msg") < 20


@pytest.mark.skipif(instructions.unavailable() is not None, reason=str(instructions.unavailable()))
def test_bench_cost_counts_instructions_per_message_the_same_twice(dsn, monkeypatch):
    """Under valgrind, about a minute: the instruction rows stand beside the others, for Courier
    and pgmq, and a second count of the same operation agrees with the first."""
    named = {operation.name: operation for operation in cost_scenario.OPERATIONS}
    send, receive = named["send"], named["receive(100)"]
    small = (dataclasses.replace(send, counted=100), dataclasses.replace(receive, counted=5))
    monkeypatch.setattr(cost_scenario, "OPERATIONS", small)
    results = {r.variant: r for r in cost(dsn, instructions=True)}
    for operation in small:
        row = results[f"{operation.name}: instructions/msg"]
        assert row.lower_is_better and row.target_ratio == 1.0
        assert row.courier.rate > 0 and row.ceiling.rate > 0
        assert "callgrind" in row.notes
    # A send does more than a bare INSERT (pgmq's): tens of thousands of instructions at least.
    assert results["send: instructions/msg"].ceiling.rate > 50_000

    with cost_scenario.counter() as counting:
        again = [cost_scenario.instructions_per_message(counting, small[0], side) for side in ("courier", "pgmq")]
    first = results["send: instructions/msg"]
    assert again[0] == pytest.approx(first.courier.rate, rel=0.03)
    assert again[1] == pytest.approx(first.ceiling.rate, rel=0.03)


def test_bench_horizon_holds_a_snapshot_while_producers_send_and_a_worker_drains(dsn):
    results = horizon(dsn, clients=1, seconds=1, rounds=1, rate=50, pinned=3, warm_up=2, recovery=3)
    assert [r.scenario for r in results] == ["horizon"] * 4
    rate, lag, released, recovered = results
    assert rate.courier.rate > 0 and rate.ceiling.rate > 0  # pgmq beside it
    assert lag.lower_is_better and released.lower_is_better and recovered.lower_is_better
    assert "courier: " in rate.notes and "pgmq: " in rate.notes
