"""When the delete reaper is due: queue-ti's delete_reaper_schedule, a cron schedule in UTC,
or else the delete_reaper_interval in seconds (which the SQL function checks itself).

The maintenance leader asks `run_delete_reaper_if_scheduled` every minute. A schedule fires
once per time it names, counted from the reaper's last run (by whoever ran it: the leader or
`courier reaper run delete`), or from when the schedule was set if it never ran; a run that
deleted a full batch left more behind, and the next check goes on at once.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import psycopg
from cronsim import CronSim, CronSimError

from .errors import translated

log = logging.getLogger("courier.maintenance")

_STATE = """
SELECT s.value, s.updated_at, r.last_run_at, r.last_count, now()
FROM courier.settings s LEFT JOIN courier.reaper_runs r ON r.reaper = 'delete'
WHERE s.name = 'delete_reaper_schedule'
"""


def next_run_after(schedule: str, since: datetime) -> datetime | None:
    """The first time after `since` that the cron schedule names, read in UTC whatever the
    session's time zone, or None when it names none or cannot be read (set_setting refuses
    such schedules, 31 February among them; one stored before it did can still be found)."""
    try:
        return next(CronSim(schedule, since.astimezone(UTC)))
    except (CronSimError, StopIteration):
        return None


def run_delete_reaper_if_scheduled(conn: psycopg.Connection, batch_size: int) -> int:
    """Run the delete reaper once if its schedule says so; returns how many it deleted."""
    with translated():
        schedule, set_at, last_run, last_count, now = conn.execute(_STATE).fetchone()
        if not schedule:
            return int(conn.execute("SELECT courier.run_delete_reaper_if_due(%s)", (batch_size,)).fetchone()[0])
        ran_since_set = last_run is not None and last_run >= set_at
        if not (ran_since_set and last_count >= batch_size):  # no backlog left by the last run
            due = next_run_after(schedule, last_run if ran_since_set else set_at)
            if due is None:
                log.warning("delete_reaper_schedule %r names no time cronsim can find; the delete reaper "
                            "does not run on its own", schedule)
                return 0
            if due > now:
                return 0
        return int(conn.execute("SELECT courier.run_delete_reaper(%s)", (batch_size,)).fetchone()[0])
