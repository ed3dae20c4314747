"""spark: the pipeline's small jobs against the trivial Spark job, and the pipeline against
the same work done in PostgreSQL.

By default: `courier pipeline analytics`, `ingest` and `replay --dry-run` (and `export`, for
the record) over 1,000 rows, each as a user runs it (a fresh process, so Spark's start-up is
included), against `spark.range(1).count()` in a fresh process whose session starts the same
way. With sizes: the data source's read rate per core against raw COPY of the same rows, and
`pipeline analytics` against the same aggregations as SQL queries, at growing archive sizes,
with where the lines would cross."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg import sql

from sqlkit import analytics as store
from sqlkit.connection import connect
from sqlkit.errors import CourierError

from .result import Measurement, ScenarioResult

DEFAULT_SIZES: tuple[int, ...] = ()  # the heavy measurements, e.g. (100_000, 1_000_000)
SMALL_ROWS = 1000
SMALL_TARGET = 1.5  # each small job takes at most this many times the trivial job
MASTER = "local[2]"
CORES = 2
READ_COLUMNS = "id,endpoint_id,status,retry_count,error_history,completed_at,created_at,payload"
SQL_QUERIES = ("sql_analytics_hourly", "sql_analytics_summary", "sql_analytics_attempts", "sql_analytics_errors")

# Archived messages over three months and ten endpoints: one in eleven dead-lettered, one in
# seventeen expired, some retried with an error history.
GROW = """
INSERT INTO courier.archive (id, endpoint_id, payload, status, priority, retry_count, error_history,
                             completed_at, created_at)
SELECT i, (SELECT id FROM courier.endpoints ORDER BY id OFFSET i %% 10 LIMIT 1),
       jsonb_build_object('i', i, 'order', jsonb_build_object('total', (i * 37) %% 250)),
       CASE WHEN i %% 11 = 0 THEN 'failed' WHEN i %% 17 = 0 THEN 'expired' ELSE 'completed' END,
       (i %% 4)::smallint, (i %% 5) / 3,
       CASE WHEN (i %% 5) / 3 = 0 THEN '[]'::jsonb
            ELSE jsonb_build_array(jsonb_build_object('attempt', 1, 'outcome', 'retryable',
                 'error', CASE WHEN i %% 2 = 0 THEN 'HTTP 503: unavailable' ELSE 'timeout after 10s' END)) END,
       t.created + make_interval(secs => ((i * 7919) %% 5000) / 1000.0), t.created
FROM generate_series(%(start)s::bigint, %(end)s::bigint) i
CROSS JOIN LATERAL (SELECT timestamptz '2026-08-01 00:00:00+00'
                           + make_interval(mins => ((i * 131) %% (60 * 24 * 92))::integer) AS created) t
"""


def _grow(conn: psycopg.Connection, current: int, target: int) -> None:
    if current == 0:
        for n in range(10):
            conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (f"bench-{n}",))
    for start in range(current + 1, target + 1, 500_000):
        conn.execute(GROW, {"start": start, "end": min(start + 499_999, target)})
    conn.execute("SELECT courier.maintain_archive_partitions(0)")
    conn.execute("VACUUM ANALYZE courier.archive")


def _cpu_seconds(pid: int) -> float | None:
    """A local process's user + system CPU time, or None if it is not on this machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spark_cpu_seconds() -> float:
    """CPU time of this process and everything it started (the JVM, PySpark's daemon and its
    Python workers, with the CPU of workers they already reaped)."""
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
            used[int(entry.name)] = sum(int(f) for f in fields[11:15]) / tick
    me = os.getpid()
    total = time.process_time()
    for pid, seconds in used.items():
        ancestor = parents.get(pid)
        while ancestor and ancestor != me:
            ancestor = parents.get(ancestor)
        total += seconds if ancestor == me else 0.0
    return total


@dataclass(frozen=True)
class Copied:
    rate: float               # rows/s
    client_cpu: float         # seconds
    server_cpu: float | None  # seconds of its backend, None when the server is not on this machine


@dataclass(frozen=True)
class Read:
    rate: float
    cpu: float                # seconds of the driver, the JVM and the Python workers


def _copy_rate(dsn: str, rows: int) -> Copied:
    """Raw COPY of the same columns out of the archive, bytes read and dropped, with the CPU it
    took (this client plus its server backend, when that runs here). The client is the data
    source's own libpq loop without the parsing, so the ratio is what parsing, Arrow and Spark
    add to COPY itself."""
    from console.pipeline.source import copy_out_blocks

    columns = sql.SQL(", ").join(sql.Identifier(c) for c in READ_COLUMNS.split(","))
    statement = sql.SQL("COPY (SELECT {} FROM courier.archive) TO STDOUT WITH (FORMAT csv)").format(columns)
    with connect(dsn) as conn:
        backend = conn.info.backend_pid
        server_before, client_before = _cpu_seconds(backend), time.process_time()
        started = time.perf_counter()
        for _ in copy_out_blocks(conn, statement):
            pass
        elapsed = time.perf_counter() - started
        server_after, client_used = _cpu_seconds(backend), time.process_time() - client_before
    server_used = server_after - server_before if server_before is not None and server_after is not None else None
    return Copied(rows / elapsed, client_used, server_used)


def _read_rate(spark: object, dsn: str, rows: int) -> Read:
    df = spark.read.format("courier").option("dsn", dsn).option("table", "archive") \
        .option("columns", READ_COLUMNS).load()  # type: ignore[attr-defined]
    cpu_before = _spark_cpu_seconds()
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()  # every row through the source, nothing else
    elapsed = time.perf_counter() - started
    return Read(rows / elapsed, _spark_cpu_seconds() - cpu_before)


def _per_core(size: int, copies: list[Copied], reads: list[Read]) -> tuple[float, float, str]:
    """Rows per CPU-second for the data source and for raw COPY, and how they were counted.
    On a shared machine wall-clock rates move with everyone else's load; CPU time does not.
    The Spark tasks' own backends are not measurable from here (their connections close with
    the task), so they are charged the server CPU per row that the raw COPY measured."""
    best_copy = max(copies, key=lambda c: c.rate)
    best_read = max(reads, key=lambda r: r.rate)
    wall = (f"wall clock: the data source {best_read.rate:,.0f} rows/s in {MASTER}, raw COPY "
            f"{best_copy.rate:,.0f} rows/s on one connection")
    measured = [c for c in copies if c.server_cpu is not None]
    if not measured:  # a remote server: fall back to wall clock over the cores Spark was given
        client = min(c.client_cpu for c in copies)
        return best_read.rate / CORES, size / client, wall + "; remote server, so per core = rows/s over cores"
    server = min(c.server_cpu for c in measured)  # type: ignore[type-var]
    copy_cores = max(1.0, (best_copy.client_cpu + (best_copy.server_cpu or 0.0)) * best_copy.rate / size)
    copy_cpu = min(c.client_cpu + c.server_cpu for c in measured)  # type: ignore[operator]
    read_cpu = min(r.cpu for r in reads) + server
    return size / read_cpu, size / copy_cpu, (
        f"CPU per 1M rows: the data source {read_cpu * 1e6 / size:.2f} s (Spark's processes "
        f"{(read_cpu - server) * 1e6 / size:.2f} s + the server's {server * 1e6 / size:.2f} s), raw COPY "
        f"{copy_cpu * 1e6 / size:.2f} s (client {(copy_cpu - server) * 1e6 / size:.2f} s); {wall}; by wall "
        f"clock over {CORES} cores the ratio is {(best_read.rate / CORES) / (best_copy.rate / copy_cores):.2f}")


def _sql_seconds(dsn: str) -> tuple[float, list[tuple]]:
    until = datetime(2100, 1, 1, tzinfo=UTC)
    with connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        started = time.perf_counter()
        results = {name: store.rows(conn, name, {"from": None, "to": until, "top": 5}) for name in SQL_QUERIES}
        elapsed = time.perf_counter() - started
    hourly = sorted((r["endpoint_id"], r["hour"], r["delivered"], r["failed"], r["expired"], r["dead_lettered"],
                     *(None if r[k] is None else float(r[k]) for k in ("p50_ms", "p95_ms", "p99_ms")))
                    for r in results["sql_analytics_hourly"])
    return elapsed, hourly


def _spark_seconds(spark: object, dsn: str) -> tuple[float, list[tuple]]:
    from console.pipeline import analytics

    started = time.perf_counter()
    analytics.run(spark, dsn, None, datetime(2100, 1, 1, tzinfo=UTC), MASTER)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    with connect(dsn) as conn:
        hourly = sorted(conn.execute("SELECT endpoint_id, hour, delivered, failed, expired, dead_lettered, "
                                     "p50_ms, p95_ms, p99_ms FROM courier.analytics_hourly").fetchall())
    return elapsed, hourly


def _crossing(points: list[tuple[int, float, float]]) -> str:
    """Where Spark's time line meets SQL's, fitted through (rows, spark s, sql s) points."""
    if len(points) < 2:
        return "one size only: no extrapolation"
    (n0, s0, q0), (n1, s1, q1) = points[0], points[-1]
    spark_slope, sql_slope = (s1 - s0) / (n1 - n0), (q1 - q0) / (n1 - n0)
    spark_fixed, sql_fixed = s0 - spark_slope * n0, q0 - sql_slope * n0
    per_million = f"Spark {spark_slope * 1e6:.2f} s + {spark_fixed:.1f} s fixed per 1M rows, " \
                  f"SQL {sql_slope * 1e6:.2f} s + {sql_fixed:.1f} s"
    if sql_slope <= spark_slope:
        return f"{per_million}: Spark's per-row cost is not lower here, so on this box the lines never cross"
    crossing = (spark_fixed - sql_fixed) / (sql_slope - spark_slope)
    return f"{per_million}: the lines cross near {crossing / 1e6:,.1f}M rows"


# The trivial job, its session started as a pipeline command over SMALL_ROWS starts its own.
BASELINE = ("from console.pipeline.session import get_session; "
            "get_session({master!r}, input_rows={rows}).range(1).count()")
CLI = "import sys; from console.cli import main; sys.exit(main(prog_name='courier'))"


@dataclass(frozen=True)
class Timed:
    seconds: float
    output: str


def _timed(argv: list[str], env: dict[str, str] | None = None) -> Timed:
    """Wall time of a fresh process, from its start to its exit; its stdout."""
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, env=env)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        raise CourierError(f"{' '.join(argv[3:5])} exited with code {done.returncode}: {last}")
    return Timed(elapsed, done.stdout)


def _small_jobs(folder: Path) -> dict[str, Sequence[Callable[[int], list[str]]]]:
    """Each small job as the command line a user types, per round (each round ingests its own
    file and exports to its own folder, so no round finds its work already done). The DSN is
    not on it (any local user can read a command line): run them with _job_env()."""
    def pipeline(*args: str) -> list[str]:
        return [sys.executable, "-c", CLI, "pipeline", *args, "--master", MASTER, "--json"]

    def ingest_file(round_: int) -> str:
        path = folder / f"backfill-{round_}.jsonl"
        if not path.exists():
            path.write_text("".join(json.dumps({"round": round_, "n": n, "order": {"total": n % 250}}) + "\n"
                                    for n in range(SMALL_ROWS)))
        return str(path)

    return {
        "trivial": lambda r: [sys.executable, "-c", BASELINE.format(master=MASTER, rows=SMALL_ROWS)],
        "analytics": lambda r: pipeline("analytics"),
        "ingest": lambda r: pipeline("ingest", ingest_file(r), "--endpoint", "bench-0"),
        "replay --dry-run": lambda r: pipeline("replay", "--dry-run"),
        "export": lambda r: pipeline("export", "--before", "2026-11-01", "--to", str(folder / f"export-{r}")),
    }


def _job_env(dsn: str) -> dict[str, str]:
    """The environment a small job runs in: the DSN as COURIER_DSN, which comes before DATABASE_URL."""
    return {**os.environ, "COURIER_DSN": dsn}


def _check(name: str, output: str) -> str:
    """What the job did, from its --json output: a job that did nothing is not a measurement."""
    data = json.loads(output) if name != "trivial" else None
    rows = {"analytics": lambda d: sum(e["delivered"] + e["expired"] + e["dead_lettered"] for e in d),
            "ingest": lambda d: d["enqueued"], "replay --dry-run": lambda d: d["matched"],
            "export": lambda d: sum(m["rows"] for m in d)}
    if data is None:
        return ""
    found = rows[name](data)
    if found != SMALL_ROWS:
        raise CourierError(f"pipeline {name} handled {found} rows, not {SMALL_ROWS}")
    return f"{found:,} rows"


def small_jobs(dsn: str, rounds: int) -> list[ScenarioResult]:
    """analytics, ingest, a replay dry run and export over 1,000 rows against the trivial job,
    each a fresh process, interleaved round by round; medians, with the spread."""
    with connect(dsn) as conn:
        _grow(conn, 0, SMALL_ROWS)
        conn.execute("SELECT courier.set_setting('max_queue_size', '2147483647')")
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="courier-bench-spark-") as folder:
        jobs, env = _small_jobs(Path(folder)), _job_env(dsn)
        for round_ in range(rounds):
            for name, argv in jobs.items():
                timed = _timed(argv(round_), env)
                _check(name, timed.output)
                samples.setdefault(name, []).append(timed.seconds)
    base = statistics.median(samples["trivial"])
    spread = {name: f"{min(s):.1f}-{max(s):.1f} s" if len(s) > 1 else f"{s[0]:.1f} s"
              for name, s in samples.items()}
    results = []
    for name, runs in samples.items():
        if name == "trivial":
            continue
        took = statistics.median(runs)
        target = SMALL_TARGET if name != "export" else None
        results.append(ScenarioResult(
            "spark", f"{name} over {SMALL_ROWS:,} rows", "runs/hour",
            Measurement(3600 / took, took * 1000), Measurement(3600 / base, base * 1000),
            target_ratio=1 / target if target else None,
            notes=f"`courier pipeline {name}` {took:.1f} s ({spread[name]}) = {took / base:.2f}x "
                  f"`spark.range(1).count()`'s {base:.1f} s ({spread['trivial']}), each a fresh process "
                  f"in {MASTER}, median of {len(runs)}"
                  + (f"; target <= {target}x" if target else "; no target (several jobs per month)")))
    return results


def spark(dsn: str, *, clients: int, seconds: float, rounds: int,
          sizes: Sequence[int] = DEFAULT_SIZES) -> list[ScenarioResult]:
    from console.extras import require

    require("spark", "courier bench spark")
    results = small_jobs(dsn, rounds)
    if not sizes:
        return results
    from console.pipeline.session import get_session

    session = get_session(MASTER)
    points: list[tuple[int, float, float]] = []
    current = SMALL_ROWS
    with connect(dsn) as conn:
        for size in sorted(s for s in sizes if s > current):
            _grow(conn, current, size)
            current = size
            _read_rate(session, dsn, min(size, 1000))  # warm: Python workers started, plans cached
            copies = [_copy_rate(dsn, size) for _ in range(rounds)]
            reads = [_read_rate(session, dsn, size) for _ in range(rounds)]
            read_per_core, copy_per_core, how = _per_core(size, copies, reads)
            results.append(ScenarioResult(
                "spark", f"read {size:,} archived rows, per core", "rows/CPU-s",
                Measurement(read_per_core), Measurement(copy_per_core), target_ratio=0.5,
                notes=f"the data source against raw COPY of the same {len(READ_COLUMNS.split(','))} columns; "
                      + how))
            sql_runs = [_sql_seconds(dsn) for _ in range(rounds)]
            spark_runs = [_spark_seconds(session, dsn) for _ in range(rounds)]
            sql_time, spark_time = min(t for t, _ in sql_runs), min(t for t, _ in spark_runs)
            equal = sql_runs[0][1] == spark_runs[0][1]
            points.append((size, spark_time, sql_time))
            results.append(ScenarioResult(
                "spark", f"analytics over {size:,} archived rows", "rows/s",
                Measurement(size / spark_time), Measurement(size / sql_time),
                notes=f"pipeline analytics {spark_time:.1f} s, the same four aggregations in SQL {sql_time:.1f} s; "
                      f"hourly results {'equal' if equal else 'DIFFER'}"))
    if points:
        results[-1] = ScenarioResult(**{**results[-1].__dict__, "notes": results[-1].notes + "; " + _crossing(points)})
    return results
