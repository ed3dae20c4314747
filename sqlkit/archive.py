"""Typed API over the archive: its partitions, its messages, and replays of archived messages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

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
class ArchivedMessage:
    """One row of an archive listing: which message, where it went, how it ended and when.
    The error is redacted; the payload is left out."""

    id: int
    endpoint_name: str  # '#<id>' once the endpoint is dropped
    status: str
    retry_count: int
    last_error: str | None
    correlation_id: UUID | None
    ordering_key: str | None
    created_at: datetime
    completed_at: datetime
    archived_at: datetime


@dataclass(frozen=True)
class ArchiveFilter:
    """Which archived messages to list; None matches every value. created_at in [from_ts, to_ts)."""

    endpoint_id: int | None = None
    status: str | None = None
    from_ts: datetime | None = None
    to_ts: datetime | None = None
    correlation_id: UUID | None = None
    ordering_key: str | None = None


@dataclass(frozen=True)
class ReplayRange:
    """What to replay: one endpoint's messages created in [from_ts, to_ts), optionally only
    those archived with one status (completed, failed or expired). A message replayed before,
    by any replay, is skipped unless `again` asks for a fresh copy."""

    endpoint_id: int
    from_ts: datetime
    to_ts: datetime
    status: str | None = None
    again: bool = False

    def params(self, **extra: object) -> dict[str, object]:
        return {"endpoint_id": self.endpoint_id, "from_ts": self.from_ts, "to_ts": self.to_ts,
                "status": self.status, "again": self.again, **extra}


@dataclass(frozen=True)
class RunningReplay:
    id: int
    replayed: int
    last_archive_id: int
    started_at: datetime


@dataclass(frozen=True)
class ReplayCount:
    """A dry run: how many the replay would enqueue, and how many of the range's messages
    were replayed before (skipped unless again)."""
    would_enqueue: int
    already_replayed: int


@dataclass(frozen=True)
class ReplayedMessage:
    message_id: int | None  # None: a copy made before copies' ids were recorded
    enqueued: bool          # False: replayed before, and its earlier copy stands


def partitions(conn: psycopg.Connection) -> list[ArchivePartition]:
    return [ArchivePartition(**row) for row in queries.fetch_all(conn, "archive_partitions")]


def count_partition(conn: psycopg.Connection, partition: str) -> int:
    return int(queries.fetch_value(conn, "count_archive_partition", {"partition": partition}))


def list_messages_page(conn: psycopg.Connection, chosen: ArchiveFilter, limit: int = 50,
                       after: int | None = None) -> tuple[list[ArchivedMessage], bool]:
    """The newest `limit` archived messages matching `chosen` (with `after`, the id the previous
    page ended with: the `limit` listed after it, older than it), and whether more follow: it
    reads limit + 1 rows, never a count of the archive."""
    params = {**vars(chosen), "limit": limit + 1, "after": after}
    rows = [ArchivedMessage(**row) for row in queries.fetch_all(conn, "list_archive_page", params)]
    return rows[:limit], len(rows) > limit


def endpoint_id(conn: psycopg.Connection, name: str) -> int:
    found = queries.fetch_value(conn, "endpoint_id", {"name": name})
    if found is None:
        raise NotFound(f'endpoint "{name}" does not exist', "P0002", "List endpoints with `courier endpoint list`")
    return int(found)


def running_replay(conn: psycopg.Connection, replay: ReplayRange) -> RunningReplay | None:
    """The interrupted replay of exactly this range that the next call would resume."""
    row = queries.fetch_one(conn, "running_replay", replay.params())
    return None if row is None else RunningReplay(**row)


def count_replayable(conn: psycopg.Connection, replay: ReplayRange) -> ReplayCount:
    """Dry run: how many messages the replay would enqueue, and how many it skips."""
    return ReplayCount(**queries.fetch_one(conn, "count_replay_range", replay.params()))


def replay_batch(conn: psycopg.Connection, replay: ReplayRange, batch_size: int) -> tuple[int, bool]:
    """Walk at most batch_size more archived messages of the range in one short transaction;
    returns how many it enqueued, and whether the range is done."""
    enqueued = int(queries.fetch_value(conn, "replay_range", replay.params(batch_size=batch_size, dry_run=False)))
    return enqueued, running_replay(conn, replay) is None


def replay_message(conn: psycopg.Connection, archive_id: int, again: bool = False) -> ReplayedMessage:
    """Enqueue one archived message again, unless it was replayed before (then its earlier
    copy stands) and again is False."""
    return ReplayedMessage(**queries.fetch_one(conn, "replay_message", {"archive_id": archive_id, "again": again}))
