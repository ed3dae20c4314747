"""dispatch-http, latency and mixed: the worker pool against real endpoints."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time

import aiohttp

from console.workers.pool import HTTP_DEFAULT_CONCURRENCY, PoolSettings, WorkerPool
from console.workers.processes import default_processes
from sqlkit.connection import connect

from .drain import WorkerDrain, cost_note, drain_with_worker_process, worker_process
from .pgbench import run_script
from .result import Measurement, ScenarioResult, measure_rounds
from .scratch import backpressure_out_of_reach, stage_lapsed


class SinkProcess:
    """The webhook sink in a process of its own, so it does not share our interpreter."""

    def __enter__(self) -> str:
        self._process = subprocess.Popen([sys.executable, "-P", "-m", "console.sink", "--port", "0", "--no-record"],
                                         stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        return self._process.stdout.readline().strip()

    def __exit__(self, *exc: object) -> None:
        self._process.terminate()
        self._process.wait(10)


def _endpoint(dsn: str, name: str, protocol: str, config: dict, retry_policy: dict | None = None) -> None:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE courier.queue, courier.dlq, courier.archive")
        conn.execute("DELETE FROM courier.endpoints WHERE name = %s", (name,))
        conn.execute("SELECT courier.create_endpoint(%s, %s, %s::jsonb, %s::jsonb)",
                     (name, protocol, json.dumps(config), json.dumps(retry_policy or {})))
        backpressure_out_of_reach(conn)


def _preload(dsn: str, name: str, messages: int) -> None:
    with connect(dsn) as conn:
        stage_lapsed(conn)
        for start in range(0, messages, 10_000):
            conn.execute("SELECT courier.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                         "FROM generate_series(%s::int, %s::int) g))", (name, start, min(start + 10_000, messages) - 1))
        conn.execute("VACUUM ANALYZE courier.queue")


def _run_pool(dsn: str, done, settings: PoolSettings, timeout: float = 600) -> tuple[WorkerPool, float]:
    pool = WorkerPool(dsn, settings)

    async def main() -> float:
        task = asyncio.create_task(pool.run())
        started = time.perf_counter()
        while not done(pool) and not task.done() and time.perf_counter() - started < timeout:
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        pool.stop()
        await task
        return elapsed

    return pool, asyncio.run(main())


# dispatch-http ----------------------------------------------------------------------

async def _load_generator(url: str, requests: int, concurrency: int) -> float:
    """A plain aiohttp client posting as fast as the sink answers: the ceiling."""
    body = json.dumps({"n": 1}).encode()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(requests):
        queue.put_nowait(n)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker() -> None:
            while not queue.empty():
                queue.get_nowait()
                async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
                    await response.read()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


def dispatch_http(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 20_000) -> ScenarioResult:
    """The pool with `courier worker`'s defaults against the sink, and a plain aiohttp load
    generator keeping as many requests open as a webhook gets by default."""
    concurrency = HTTP_DEFAULT_CONCURRENCY
    with SinkProcess() as sink_url:
        url = f"{sink_url}/healthy"
        trips: list[float] = []
        drains: list[WorkerDrain] = []

        def courier() -> Measurement:
            _endpoint(dsn, "http-bench", "http", {"url": url, "allow_internal": True})
            _preload(dsn, "http-bench", messages)
            drained = drain_with_worker_process(dsn, messages)
            drains.append(drained)
            if drained.round_trips_per_message is not None:
                trips.append(drained.round_trips_per_message)
            return Measurement(drained.rate)

        def ceiling() -> Measurement:
            return Measurement(messages / asyncio.run(_load_generator(url, messages, concurrency)))

        measured = measure_rounds({"ceiling": ceiling, "courier": courier}, rounds)
    return ScenarioResult(
        scenario="dispatch-http", variant=f"{messages:,} msgs, `courier worker` defaults", unit="msg/s",
        courier=measured["courier"], ceiling=measured["ceiling"], target_ratio=0.8,
        notes=f"`courier worker` with no flags, in its own processes ({default_processes()} pools sharing "
              f"{concurrency} requests at once to one webhook, each with a batch prefetched) vs a plain aiohttp "
              f"load generator with {concurrency} connections, against the stdlib-threaded sink in its own "
              f"process; {min(trips) if trips else float('nan'):.3f} database round trips per message "
              f"(all transactions on the database while it drained); {cost_note(drains, messages)} (the sink's "
              "CPU not included)",
    )


# latency ---------------------------------------------------------------------------

LOAD_CLIENTS = 8
"""Connections pgbench offers the load from: enough that a send slowed by a busy moment does
not hold back the schedule (Python sender threads reached only 830-1,580 of 2,000 sends/s)."""


def _offer_load(dsn: str, rate: float, seconds: float) -> int:
    """Send at `rate` per second for `seconds`, one send per transaction, on pgbench's schedule
    (an open loop: sends start on time however long the earlier ones took); returns how many
    were sent."""
    run = run_script(dsn, "SELECT courier.send('latency', '{\"n\": 1}');\n",
                     clients=LOAD_CLIENTS, seconds=seconds, rate=rate)
    return run.transactions


WARM_UP_SECONDS = 2.0
"""Load offered before the measured run and left out of its figures: a worker's first seconds
(its pools loading their dispatchers, the maintenance leader's start-up jobs) are not its
steady state, and stalled the first messages of a run by tens of milliseconds."""


def _latency_at(dsn: str, rate: float, seconds: float) -> ScenarioResult:
    _endpoint(dsn, "latency", "noop", {})
    pools = default_processes()
    with connect(dsn) as conn, worker_process(dsn) as worker:
        deadline = time.monotonic() + 30
        while _running_pools(conn) < pools:  # every pool listening before the first send
            if worker.poll() is not None or time.monotonic() > deadline:
                raise worker.failure("the worker's pools did not all start")
            time.sleep(0.05)
        warm_up = _offer_load(dsn, rate, WARM_UP_SECONDS)
        _wait_until_completed(conn, warm_up)
        measured_from = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        sent = _offer_load(dsn, rate, seconds)
        _wait_until_completed(conn, warm_up + sent)
        latencies = [float(row[0]) for row in conn.execute(
            "SELECT extract(epoch FROM completed_at - created_at) * 1000 FROM courier.archive "
            "WHERE status = 'completed' AND created_at >= %s", (measured_from,))]
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    achieved = sent / seconds
    return ScenarioResult(
        scenario="latency", variant=f"{rate:,.0f}/s offered ({achieved:,.0f}/s sent)", unit="ms",
        courier=Measurement(quantiles[49], quantiles[98]), ceiling=None,
        notes=f"p50 {quantiles[49]:.1f} ms, p99 {quantiles[98]:.1f} ms from the send's transaction start to "
              f"the recorded completion of {len(latencies):,} of {sent:,} sent, `courier worker` with no flags "
              f"({pools} pools), sent by pgbench at a fixed rate from {LOAD_CLIENTS} connections after "
              f"{WARM_UP_SECONDS:g} s of the same load left out; "
              "targets: p50 <= 5 ms at 500/s, p99 <= 10 ms at 2,000/s",
    )


def _wait_until_completed(conn, messages: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _completed(conn) < messages and time.monotonic() < deadline:
        time.sleep(0.05)


def _running_pools(conn) -> int:
    return conn.execute("SELECT count(*) FROM courier.workers WHERE state = 'running' "
                        "AND last_heartbeat > now() - interval '10 seconds'").fetchone()[0]


def _completed(conn) -> int:
    return conn.execute("SELECT count(*) FROM courier.archive WHERE status = 'completed'").fetchone()[0]


def latency(dsn: str, *, clients: int, seconds: float, rounds: int) -> list[ScenarioResult]:
    return [_latency_at(dsn, rate, seconds) for rate in (500, 2000)]


# mixed -----------------------------------------------------------------------------

def mixed(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 5_000) -> ScenarioResult:
    """ulak's stress mix: 70% succeed, 20% fail, 10% slow; every message accounted for."""
    with SinkProcess() as sink_url:
        policy = {"max_retries": 1, "backoff": "fixed", "base_delay_seconds": 1}
        with connect(dsn) as conn:
            conn.execute("TRUNCATE courier.queue, courier.dlq, courier.archive")
            conn.execute("DELETE FROM courier.endpoints WHERE name LIKE 'mixed-%'")
            backpressure_out_of_reach(conn)
            conn.execute("SELECT courier.set_setting('circuit_breaker_threshold', '1000')")
            for name, path in (("mixed-ok", "/healthy"), ("mixed-fail", "/status/500"), ("mixed-slow", "/slow")):
                conn.execute("SELECT courier.create_endpoint(%s, 'http', %s::jsonb, %s::jsonb)",
                             (name, json.dumps({"url": sink_url + path, "allow_internal": True}), json.dumps(policy)))
        shares = {"mixed-ok": 0.7, "mixed-fail": 0.2, "mixed-slow": 0.1}
        for name, share in shares.items():
            _preload(dsn, name, int(messages * share))
        sent = sum(int(messages * share) for share in shares.values())

        deliverable = int(messages * shares["mixed-ok"]) + int(messages * shares["mixed-slow"])

        def settled(pool: WorkerPool) -> bool:
            # Done when the healthy and slow endpoints are drained. The failing endpoint's
            # circuit may open first (as it should), leaving its rest pending.
            return pool.stats.delivered >= deliverable

        pool, elapsed = _run_pool(dsn, settled, PoolSettings(concurrency=256, batch_size=100, poll_interval=0.2))
        with connect(dsn) as conn:
            delivered = conn.execute("SELECT count(*) FROM courier.archive WHERE status = 'completed'").fetchone()[0]
            dead = conn.execute("SELECT count(*) FROM courier.dlq").fetchone()[0]
            pending = conn.execute("SELECT count(*) + (SELECT count(*) FROM courier.send_stage) FROM courier.queue "
                                   "WHERE status IN ('pending', 'processing')").fetchone()[0]
    accounted = delivered + dead + pending == sent
    return ScenarioResult(
        scenario="mixed", variant=f"{sent:,} msgs 70/20/10", unit="msg/s",
        courier=Measurement((pool.stats.delivered + pool.stats.dead_lettered) / elapsed), ceiling=None,
        notes=f"delivered {delivered} + DLQ {dead} + pending {pending} = {delivered + dead + pending} of {sent} sent "
              f"({'all accounted for' if accounted else 'MISMATCH'}); failures (HTTP 500) retried once after 1 s "
              f"until the failing endpoint's circuit opened; rate = (delivered + dead-lettered) / time to drain "
              "the healthy and slow endpoints",
    )
