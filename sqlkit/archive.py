"""Typed API over the archive: its partitions, and replays of archived messages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from . import queries
from .errors import NotFound


@dataclass(frozen=True)
class ArchivePartition:
    partition_name: str
    range_from: datetime | None
    range_to: datetime | None
    estimated_rows: int
    total_bytes: int


@dataclass(frozen=True)
class ReplayRange:
    """What to replay: one endpoint's messages created in [from_ts, to_ts), optionally only
    those archived with one status (completed, failed or expired)."""

    endpoint_id: int
    from_ts: datetime
    to_ts: datetime
    status: str | None = None

    def params(self, **extra: object) -> dict[str, object]:
        return {"endpoint_id": self.endpoint_id, "from_ts": self.from_ts, "to_ts": self.to_ts,
                "status": self.status, **extra}


@dataclass(frozen=True)
class RunningReplay:
    id: int
    replayed: int
    last_archive_id: int
    started_at: datetime


def partitions(conn: psycopg.Connection) -> list[ArchivePartition]:
    return [ArchivePartition(**row) for row in queries.fetch_all(conn, "archive_partitions")]


def count_partition(conn: psycopg.Connection, partition: str) -> int:
    return int(queries.fetch_value(conn, "count_archive_partition", {"partition": partition}))


def endpoint_id(conn: psycopg.Connection, name: str) -> int:
    found = queries.fetch_value(conn, "endpoint_id", {"name": name})
    if found is None:
        raise NotFound(f'endpoint "{name}" does not exist', "P0002", "List endpoints with `courier endpoint list`")
    return int(found)


def running_replay(conn: psycopg.Connection, replay: ReplayRange) -> RunningReplay | None:
    """The interrupted replay of exactly this range that the next call would resume."""
    row = queries.fetch_one(conn, "running_replay", replay.params())
    return None if row is None else RunningReplay(**row)


def count_replayable(conn: psycopg.Connection, replay: ReplayRange) -> int:
    """Dry run: how many messages the replay would still enqueue."""
    return int(queries.fetch_value(conn, "replay_range", replay.params(batch_size=None, dry_run=True)))


def replay_batch(conn: psycopg.Connection, replay: ReplayRange, batch_size: int) -> int:
    """Replay at most batch_size more messages in one short transaction; returns how many."""
    return int(queries.fetch_value(conn, "replay_range", replay.params(batch_size=batch_size, dry_run=False)))


def replay_message(conn: psycopg.Connection, archive_id: int) -> int:
    """Enqueue one archived message again; returns the new message's id."""
    return int(queries.fetch_value(conn, "replay_message", {"archive_id": archive_id}))
