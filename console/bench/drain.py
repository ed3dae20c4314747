"""drain-noop and multi-endpoint: `courier worker`, started exactly as a user starts it (no
flags), drains preloaded messages on noop endpoints through the whole lifecycle (claim,
dispatch, report, archive).

drain-noop's ceiling is the same lifecycle as bare SQL, as BENCHMARKS.md defines it: a bare
table of the queue's shape and a bare archive table; a batched SKIP LOCKED claim of 100 into
processing, then one DELETE ... RETURNING of them into the archive table, driven by pgbench in
the same run. Its notes add the figure the ceiling had before it moved messages to an archive
(the same claim, then completing the rows in place), and the "SQL path": Courier's own
report-and-claim function driven by pgbench, so that each run shows whether the loss is in
SQL or in Python. multi-endpoint spreads the messages over 20
endpoints; its ceiling is the single-endpoint drain of the same number of messages, and it
reports the database round trips per message (transactions on the scratch database, less
the benchmark's own).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from console.workers.pool import PoolSettings
from sqlkit.connection import connect
from sqlkit.errors import CourierError

from . import cpu
from .pgbench import run_script
from .result import Measurement, ScenarioResult, measure_rounds
from .scratch import stage_lapsed

CEILING_TABLE = """
DROP TABLE IF EXISTS public.bench_drain, public.bench_drain_archive;
-- At the queue's fillfactor (migration 0056).
CREATE TABLE public.bench_drain (LIKE courier.queue INCLUDING DEFAULTS INCLUDING IDENTITY) WITH (fillfactor = 50);
ALTER TABLE public.bench_drain ADD PRIMARY KEY (id);
CREATE INDEX ON public.bench_drain (id) WHERE status = 'pending';
CREATE TABLE public.bench_drain_archive (LIKE courier.queue INCLUDING DEFAULTS);
ALTER TABLE public.bench_drain_archive ADD PRIMARY KEY (id);
"""

# Claims a batch (100, as BENCHMARKS.md defines the ceiling) into processing; the next step
# finishes them. Two transactions per batch, as the ceiling always had.
_CEILING_CLAIM = """
WITH picked AS (SELECT id FROM public.bench_drain WHERE status = 'pending' ORDER BY id LIMIT :batch
                FOR UPDATE SKIP LOCKED),
     claimed AS (UPDATE public.bench_drain q SET status = 'processing' FROM picked WHERE q.id = picked.id
                 RETURNING q.id)
SELECT coalesce(array_agg(id), '{}') AS ids FROM claimed \\gset
"""

# The full lifecycle (BENCHMARKS.md): the claimed rows move to the archive table in one
# statement.
CEILING_SCRIPT = _CEILING_CLAIM + """
WITH moved AS (DELETE FROM public.bench_drain WHERE id = ANY (:ids::bigint[]) AND status = 'processing'
               RETURNING *)
INSERT INTO public.bench_drain_archive SELECT * FROM moved;
"""

# The ceiling before issue 13's correction: the claimed rows complete in place, no archive.
IN_PLACE_SCRIPT = _CEILING_CLAIM + """
UPDATE public.bench_drain SET status = 'completed' WHERE id = ANY (:ids::bigint[]) AND status = 'processing';
"""

# Each transaction reports the batch the previous one claimed and claims the next, as the
# worker's claim loop does with report_and_claim; a claim that found the endpoint's claim
# slots taken pauses a millisecond, as the worker's does, rather than spin.
SQL_PATH_SCRIPT = """
SELECT coalesce(array_agg(id) FILTER (WHERE id IS NOT NULL), '{}') AS ids,
       coalesce(array_agg(lease) FILTER (WHERE id IS NOT NULL), '{}') AS leases,
       coalesce(bool_or(busy), false)::integer AS busy
FROM courier.report_and_claim('pgbench', 100, :endpoint, :ids::bigint[], :leases::integer[],
                                 array_fill('success'::text, ARRAY[cardinality(:ids::bigint[])]),
                                 array_fill(NULL::text, ARRAY[cardinality(:ids::bigint[])])) \\gset
\\if :busy
\\sleep 1 ms
\\endif
"""

ENDPOINTS = 20
POLL = 0.02


def _endpoints(dsn: str, count: int) -> list[str]:
    names = ["drain"] if count == 1 else [f"drain-{n:02d}" for n in range(count)]
    with connect(dsn) as conn:
        conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
        for name in names:
            if not conn.execute("SELECT 1 FROM courier.endpoints WHERE name = %s", (name,)).fetchone():
                conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    return names


def _preload_queue(dsn: str, messages: int, names: list[str]) -> None:
    with connect(dsn) as conn:
        stage_lapsed(conn)
        conn.execute("TRUNCATE courier.queue, courier.archive")
        share = messages // len(names)
        for index, name in enumerate(names):
            count = share + (messages % len(names) if index == 0 else 0)
            for start in range(0, count, 10_000):
                end = min(start + 10_000, count) - 1
                conn.execute("SELECT courier.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                             "FROM generate_series(%s::int, %s::int) g))", (name, start, end))
        conn.execute("VACUUM ANALYZE courier.queue")


@dataclass(frozen=True)
class WorkerDrain:
    rate: float
    round_trips_per_message: float | None
    worker_cpu_seconds: float | None = None
    """CPU time of the worker and its pool processes over the drain (Linux /proc)."""
    database_cpu_seconds: float | None = None
    """CPU time of the PostgreSQL server's processes over the drain, when it runs on this machine."""


def _transactions(conn) -> int:
    return conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                        "WHERE datname = current_database()").fetchone()[0]


def _drain_with_worker(dsn: str, messages: int, names: list[str], args: tuple[str, ...] = ()) -> WorkerDrain:
    _preload_queue(dsn, messages, names)
    return drain_with_worker_process(dsn, messages, args)


class WorkerProcess(subprocess.Popen):
    """`courier worker` with its log kept, so that a benchmark whose worker failed can say why."""

    def __init__(self, dsn: str, log: IO[str], args: tuple[str, ...] = ()) -> None:
        # The bench made its scratch database a moment ago: one it cannot reach is a failure to
        # report, not one to wait out as a deployed worker does.
        super().__init__([sys.executable, "-P", "-c", "from console.cli import main; main()", "worker",
                          "--exit-if-unavailable", *args],
                         env={**os.environ, "COURIER_DSN": dsn}, stdout=subprocess.DEVNULL, stderr=log)
        self._log = log

    def failure(self, what: str) -> CourierError:
        """`what` went wrong, with how the worker ended and the last line it logged."""
        self._log.seek(0)
        lines = [line.strip() for line in self._log if line.strip()]
        state = "still running" if self.poll() is None else f"exited with code {self.returncode}"
        last = f"; its last log line: {lines[-1][:300]}" if lines else ""
        return CourierError(f"{what}: `courier worker` {state}{last}")


@contextlib.contextmanager
def worker_process(dsn: str, args: tuple[str, ...] = ()) -> Iterator[WorkerProcess]:
    """`courier worker` as a user starts it, with no flags (or `args`), stopped with SIGTERM
    (its drain) on the way out."""
    with tempfile.TemporaryFile("w+") as log:
        process = WorkerProcess(dsn, log, args)
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def drain_with_worker_process(dsn: str, messages: int, args: tuple[str, ...] = ()) -> WorkerDrain:
    """Run `courier worker` with no flags (or `args`) until the `messages` preloaded messages
    are gone; the rate counts from the first delivery to the last."""
    with connect(dsn) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        before = _transactions(conn)
        own = 1  # this connection's transactions, read back out of the count below
        server_pid = conn.info.backend_pid
        with worker_process(dsn, args) as process:
            worker_cpu = database_cpu = worker_before = database_before = None
            started = finished = None
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline and process.poll() is None:
                left = conn.execute("SELECT coalesce(sum(messages), 0) FROM courier.queue_depth "
                                    "WHERE status IN ('pending', 'processing')").fetchone()[0]
                own += 1
                now = time.perf_counter()
                if started is None and left < messages:
                    started = now
                    # What it costs counts from the first delivery too, not the worker's start-up.
                    worker_before, database_before = cpu.tree_seconds(process.pid), cpu.server_seconds(server_pid)
                if left == 0:
                    finished = now
                    worker_cpu = _spent(worker_before, cpu.tree_seconds(process.pid))
                    database_cpu = _spent(database_before, cpu.server_seconds(server_pid))
                    break
                time.sleep(POLL)
            if started is None or finished is None:
                raise process.failure("the worker did not drain the queue")
        time.sleep(0.7)  # backends report their statistics as they exit
        conn.execute("SELECT pg_stat_clear_snapshot()")
        own += 1
        trips = _transactions(conn) - before - own
    # The first poll that saw progress came up to one poll after the first delivery.
    elapsed = finished - started + POLL / 2
    return WorkerDrain(messages / elapsed, trips / messages if trips > 0 else None, worker_cpu, database_cpu)


def _spent(before: float | None, after: float | None) -> float | None:
    return after - before if before is not None and after is not None else None


def _drain_with_pgbench(dsn: str, messages: int, clients: int, script: str = CEILING_SCRIPT,
                        batch: int = 100) -> Measurement:
    """The bare-SQL lifecycle over `messages` rows; finished rows are those in the archive
    table (CEILING_SCRIPT) or completed in place (IN_PLACE_SCRIPT)."""
    with connect(dsn) as conn:
        conn.execute("TRUNCATE public.bench_drain, public.bench_drain_archive")
        conn.execute("INSERT INTO public.bench_drain (endpoint_id, payload) "
                     "SELECT 1, jsonb_build_object('n', g) FROM generate_series(1, %s::int) g", (messages,))
        conn.execute("VACUUM ANALYZE public.bench_drain")
    per_client = -(-messages // (batch * clients)) + 1
    started = time.perf_counter()
    run_script(dsn, script, clients=clients, transactions=per_client, defines={"batch": str(batch)})
    elapsed = time.perf_counter() - started
    with connect(dsn) as conn:
        done = conn.execute("SELECT (SELECT count(*) FROM public.bench_drain_archive)"
                            " + (SELECT count(*) FROM public.bench_drain WHERE status = 'completed')").fetchone()[0]
    return Measurement(done / elapsed)


def _sql_path_with_pgbench(dsn: str, messages: int, clients: int) -> Measurement:
    names = _endpoints(dsn, 1)
    _preload_queue(dsn, messages, names)
    with connect(dsn) as conn:
        endpoint = conn.execute("SELECT id FROM courier.endpoints WHERE name = %s", (names[0],)).fetchone()[0]
    per_client = -(-messages // (100 * clients)) + 2
    started = time.perf_counter()
    run_script(dsn, SQL_PATH_SCRIPT, clients=clients, transactions=per_client,
               defines={"endpoint": str(endpoint), "ids": "{}", "leases": "{}"})
    elapsed = time.perf_counter() - started
    with connect(dsn) as conn:
        done = conn.execute("SELECT count(*) FROM courier.archive").fetchone()[0]
        conn.execute("TRUNCATE courier.queue, courier.archive")
    return Measurement(done / elapsed)


def drain_noop(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 200_000,
               processes: tuple[int, ...] = ()) -> ScenarioResult | list[ScenarioResult]:
    """`processes` (e.g. 1,2,4,8): also the scaling curve of `courier worker --processes N`."""
    with connect(dsn) as conn:
        conn.execute(CEILING_TABLE)
    names = _endpoints(dsn, 1)
    if processes:
        return [_drain_noop_defaults(dsn, names, clients, rounds, messages),
                *drain_scaling(dsn, names, rounds, messages, processes)]
    return _drain_noop_defaults(dsn, names, clients, rounds, messages)


def _drain_noop_defaults(dsn: str, names: list[str], clients: int, rounds: int, messages: int) -> ScenarioResult:
    trips: list[float] = []
    drains: list[WorkerDrain] = []

    def courier() -> Measurement:
        drained = _drain_with_worker(dsn, messages, names)
        drains.append(drained)
        if drained.round_trips_per_message is not None:
            trips.append(drained.round_trips_per_message)
        return Measurement(drained.rate)

    measured = measure_rounds({
        "ceiling": lambda: _drain_with_pgbench(dsn, messages, clients),
        "in place": lambda: _drain_with_pgbench(dsn, messages, clients, IN_PLACE_SCRIPT),
        "at the worker's batch": lambda: _drain_with_pgbench(dsn, messages, clients, batch=PoolSettings.batch_size),
        "sql path": lambda: _sql_path_with_pgbench(dsn, messages, clients),
        "courier": courier,
    }, rounds)
    sql_path = measured["sql path"].rate
    in_place = measured["in place"].rate
    at_batch = measured["at the worker's batch"].rate
    return ScenarioResult(
        scenario="drain-noop", variant=f"{messages:,} msgs, `courier worker` defaults", unit="msg/s",
        courier=measured["courier"], ceiling=measured["ceiling"], target_ratio=0.5,
        notes=f"`courier worker` with no flags, in its own process, vs pgbench ({clients} clients) claiming 100 "
              f"into processing and moving them to an archive table with one DELETE ... RETURNING (completing "
              f"them in place instead, the ceiling before issue 13: {in_place:,.0f} msg/s = "
              f"{in_place / measured['ceiling'].rate:.2f}x this one; in batches of {PoolSettings.batch_size}, as the "
              f"worker claims: {at_batch:,.0f} msg/s, the worker {measured['courier'].rate / at_batch:.2f} of it). "
              f"SQL path (Courier's report_and_claim of 100 under pgbench): "
              f"{sql_path:,.0f} msg/s = {sql_path / measured['ceiling'].rate:.2f} of the ceiling; the worker "
              f"reached {measured['courier'].rate / sql_path:.2f} of its SQL path"
              + (f"; {min(trips):.3f} database round trips per message" if trips else "")
              + f"; {cost_note(drains, messages)}",
    )


def drain_scaling(dsn: str, names: list[str], rounds: int, messages: int,
                  processes: tuple[int, ...]) -> list[ScenarioResult]:
    """`courier worker --processes N` for each N, each against the bare lifecycle under pgbench
    with N clients, and what a thousand messages cost in CPU: the worker's processes, and the
    database server's when it runs on this machine."""
    runs: dict[str, object] = {}
    cost: dict[int, list[WorkerDrain]] = {n: [] for n in processes}

    def worker(n: int) -> Measurement:
        drained = _drain_with_worker(dsn, messages, names, ("--processes", str(n)))
        cost[n].append(drained)
        return Measurement(drained.rate)

    for n in processes:
        runs[f"worker {n}"] = lambda n=n: worker(n)
        runs[f"ceiling {n}"] = lambda n=n: _drain_with_pgbench(dsn, messages, n)
    measured = measure_rounds(runs, rounds)
    peak = max(measured[f"worker {n}"].rate for n in processes)
    results = []
    for n in processes:
        rate = measured[f"worker {n}"].rate
        results.append(ScenarioResult(
            scenario="drain-noop", variant=f"--processes {n}, {messages:,} msgs", unit="msg/s",
            courier=measured[f"worker {n}"], ceiling=measured[f"ceiling {n}"], target_ratio=None,
            notes=f"`courier worker --processes {n}` vs the bare lifecycle under pgbench with {n} client(s); "
                  f"{rate / peak:.2f} of the curve's peak ({peak:,.0f} msg/s); " + cost_note(cost[n], messages)))
    return results


def cost_note(drains: list[WorkerDrain], messages: int) -> str:
    """CPU-seconds per 1,000 messages (the median over the rounds) of the worker's processes
    and of the database server."""
    def per_thousand(values: list[float | None]) -> str:
        known = sorted(v for v in values if v is not None)
        return f"{known[len(known) // 2] * 1000 / messages:.3f}" if known else "n/a"

    return (f"CPU-seconds per 1,000 messages: worker {per_thousand([d.worker_cpu_seconds for d in drains])}, "
            f"database {per_thousand([d.database_cpu_seconds for d in drains])}")


def multi_endpoint(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 100_000,
                   endpoints: int = ENDPOINTS) -> ScenarioResult:
    single, many = _endpoints(dsn, 1), _endpoints(dsn, endpoints)
    trips: dict[str, list[float]] = {"single": [], "many": []}

    def drain(key: str, names: list[str]) -> Measurement:
        drained = _drain_with_worker(dsn, messages, names)
        if drained.round_trips_per_message is not None:
            trips[key].append(drained.round_trips_per_message)
        return Measurement(drained.rate)

    measured = measure_rounds({"single": lambda: drain("single", single), "many": lambda: drain("many", many)},
                              rounds)
    many_trips = min(trips["many"]) if trips["many"] else None
    single_trips = min(trips["single"]) if trips["single"] else None
    return ScenarioResult(
        scenario="multi-endpoint", variant=f"{messages:,} msgs over {endpoints} endpoints", unit="msg/s",
        courier=measured["many"], ceiling=measured["single"], target_ratio=0.8,
        notes="`courier worker` defaults; ceiling: the same worker draining as many messages on one endpoint. "
              + (f"{many_trips:.3f} database round trips per message over {endpoints} endpoints "
                 f"(target <= 0.05), {single_trips:.3f} on one" if many_trips is not None and single_trips is not None
                 else "round trips could not be counted"),
    )
