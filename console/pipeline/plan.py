"""Before Spark starts: what a pipeline command will read, counted exactly in one SQL
statement with the very conditions the data source reads with, and whether the job needs
Spark at all.

Spark's start-up (a JVM, Py4J, a SparkContext) costs 8-13 s on an idle 2-core machine and far
more on a busy one, whatever the job. So:

- nothing to read: the command answers at once, without Spark (and without a JVM);
- up to TINY_ROWS rows: the command does the same work here, in SQL and in this Python
  process, and gives the same output as the Spark path (tests/test_pipeline_small_jobs.py
  runs both on the same data and compares them);
- more: Spark, as before.

The count replaced an estimate that summed every archive partition's planner statistics, or,
for a partition never analysed (reltuples -1), its id range; ids interleave across months,
so each such range spans nearly the whole archive: 12,003 archived rows were announced as
"about 122,458", and an endpoint with 3 rows as the whole archive. The count is exact and
filtered as the read is. Its cost: a created_at range (replay) prunes the monthly partitions
and uses the BRIN index; analytics' completed_at range has no index (adding one is a
migration, outside this change), so it scans the archive once in PostgreSQL, which is far
less than the Spark read it precedes (50,000 rows: 0.1 s).

TINY_ROWS was chosen by measuring both paths on the same data (`courier pipeline ...` with and
without COURIER_PIPELINE_TINY_ROWS=0), on a 2-core machine with a load average of 8-9 (a
parallel test suite), so the absolute times are long; the ratios are what count:

                                   rows    without Spark   with Spark (start-up included)
    analytics (aggregate, store)  12,003       0.4 s          46-76 s
    analytics                     50,000       4.1 s          75 s
    replay (enqueue)              16,666       9.9 s         108 s (of it 38 s start-up)
    replay (enqueue)              50,000      35.5 s          (not run: the same writes plus start-up)
    replay dry run                50,000       1.8 s          (any size: the SQL count is the answer)

Without Spark the work is the same SQL (analytics: sqlkit/pipeline.sql's sql_analytics_*
queries, already held equal to the Spark job; replay and ingest: the same reader query and
the same courier writer, in one transaction), so below 50,000 rows it always wins by Spark's
start-up. What bounds it is memory and parallelism, not speed: a replay or an ingest holds its
rows in this process (50,000 archived rows are tens of MB) and writes them in one transaction,
which is also what the Spark path does up to SMALL_INPUT_ROWS (one shuffle partition, one
write task); above that Spark streams the rows and writes in parallel transactions. So
TINY_ROWS is SMALL_INPUT_ROWS, 50,000. An export still uses Spark whenever a month needs
writing (its Parquet files are Spark's, read back by Spark to verify them and by `replay
--from`); only an export with nothing to write starts none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlkit import analytics as store

from .session import SMALL_INPUT_ROWS

TINY_ROWS = SMALL_INPUT_ROWS
# Overrides TINY_ROWS: 0 sends every job with rows to Spark (an empty one still needs none).
TINY_ROWS_ENV = "COURIER_PIPELINE_TINY_ROWS"


def tiny_rows() -> int:
    given = os.environ.get(TINY_ROWS_ENV, "").strip()
    return int(given) if given.isdigit() else TINY_ROWS


def tiny(rows: int | None) -> bool:
    """Can a job of this many rows run without Spark? (None: unknown, so no.)"""
    return rows is not None and (rows == 0 or rows <= tiny_rows())


def _where(options: dict[str, Any], pushed: Sequence[tuple[str, str, Any]] = ()) -> Any:
    """The data source's own conditions for these read options and pushed filters."""
    from psycopg import sql

    from .source import CourierReader, _options

    reader = CourierReader(_options(options), [])
    reader.pushed.extend(pushed)
    conditions = reader.conditions()
    return sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("true")


def count_archive(dsn: str, options: dict[str, Any], pushed: Sequence[tuple[str, str, Any]] = ()) -> int:
    """The archived rows a read with these options (and pushed filters) returns, exactly."""
    from .source import _connect

    with _connect(dsn) as conn:
        return int(store.value(conn, "count_archive", where=_where(options, pushed)))


@dataclass(frozen=True)
class ReplayCount:
    matched: int
    already_replayed: int
    by_endpoint: dict[str | None, int] = field(default_factory=dict)


def count_replay(dsn: str, options: dict[str, Any], pushed: Sequence[tuple[str, str, Any]] = ()) -> ReplayCount:
    """A replay's matching rows per endpoint name and how many were replayed before, exactly."""
    from .source import _connect

    with _connect(dsn) as conn:
        found = store.rows(conn, "count_replay", where=_where(options, pushed))
    return ReplayCount(sum(int(r["matched"]) for r in found), sum(int(r["replayed"]) for r in found),
                       {r["endpoint"]: int(r["matched"]) for r in found})
