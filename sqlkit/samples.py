"""What the queue measured over time: the maintenance leader's samples (courier.metric_samples)
and the history, with rates and gaps, that the console and `courier status --history` read.

The SQL is in functions/observability.sql (record_metric_samples, metric_history); this module
only calls it, and returns dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row

from .errors import translated

DEFAULT_INTERVAL = 10.0
"""Seconds between samples: what MaintenanceSchedule.metric_samples defaults to."""

_RECORD = "SELECT courier.record_metric_samples(%(interval)s::real)"
_HISTORY = "SELECT * FROM courier.metric_history(%(since)s, %(until)s, %(per_endpoint)s)"


@dataclass(frozen=True)
class MetricSample:
    """One sample of the whole queue (endpoint_name None) or of one endpoint, and what happened
    since the sample before it."""

    sampled_at: datetime
    endpoint_name: str | None
    seconds: float | None
    """Seconds since the sample before; None for the first sample there is."""
    gap: bool
    """No sample was taken for more than two intervals before this one (no maintenance leader
    ran): draw no line across it. Its counts cover the whole gap; its rates are None."""
    interval_seconds: float
    """How often the leader meant to sample when it took this one."""
    pending: int
    processing: int
    dlq: int
    """Dead-lettered messages awaiting redrive or cleanup."""
    delivered: int | None
    failed: int | None
    """Failed delivery attempts (each retry counts)."""
    dead_lettered: int | None
    delivered_per_second: float | None
    failed_per_second: float | None
    dead_lettered_per_second: float | None


def record(conn: psycopg.Connection, interval: float = DEFAULT_INTERVAL) -> int:
    """Take a sample now (what the maintenance leader does every interval), and delete those
    past metric_samples_retention_hours. Nothing is written within half an interval of the last
    sample."""
    with translated():
        row = conn.execute(_RECORD, {"interval": interval}).fetchone()
    return int(row[0]) if row else 0


async def record_async(conn: psycopg.AsyncConnection, interval: float = DEFAULT_INTERVAL) -> int:
    with translated():
        cursor = await conn.execute(_RECORD, {"interval": interval})
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


def history(conn: psycopg.Connection, since: datetime, until: datetime | None = None, *,
            per_endpoint: bool = False) -> list[MetricSample]:
    """The samples from since to until (None: now), oldest first: the whole queue's, or each
    endpoint's (per_endpoint)."""
    params = {"since": since, "until": until, "per_endpoint": per_endpoint}
    with translated(), conn.cursor(row_factory=class_row(MetricSample)) as cur:
        cur.execute(_HISTORY, params)
        return cur.fetchall()


def latest_rates(samples: list[MetricSample]) -> dict[str, float]:
    """Each endpoint's delivered/s of its newest sample in a per-endpoint history, for the ones
    whose newest sample has a rate (not the first there is, nor one after a gap)."""
    rates: dict[str, float] = {}
    for sample in samples:  # oldest first: the newest one wins
        if sample.endpoint_name is not None:
            if sample.delivered_per_second is None:
                rates.pop(sample.endpoint_name, None)
            else:
                rates[sample.endpoint_name] = sample.delivered_per_second
    return rates
