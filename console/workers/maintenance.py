"""The maintenance leader: one worker in the cluster runs expiry, stale and dead-worker
recovery, archiving, partition upkeep, retention and the metric samples, elected by a lease in
the database.

Every pool runs a `MaintenanceLeader`. It holds a connection of its own; whichever one's
`try_lead_maintenance()` wins the lease leads while it renews it (before every job) from
that connection. When a leader dies its session ends and another worker wins the next
election, within `election_interval` seconds; a leader that hangs loses the lease when it
expires. The lease is a row only Courier's owner writes: unlike the advisory lock it replaced,
no other database user can hold it. The jobs themselves are SQL functions; this module only
keeps their schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psycopg

from sqlkit import queries, samples
from sqlkit.archive_retention import LOCK_NOT_AVAILABLE, drop_expired_partitions
from sqlkit.connection import connect, connect_async
from sqlkit.errors import CourierError, DatabaseUnavailable
from sqlkit.hot_table_vacuum import vacuum_hot_tables
from sqlkit.reaper_schedule import run_delete_reaper_if_scheduled

from .circuit_log import CircuitLog

log = logging.getLogger("courier.maintenance")

LEADER_APPLICATION_NAME = "courier-maintenance"
DEPTH_REBUILD_JOB = "depth_rebuild"
LOCK_RETRY_PAUSE = 0.5
LEASE_RENEWAL_DURING_JOBS = 10.0
"""Seconds between renewals of the lease while a long job runs on a connection of its own
(the lease lasts 60 s: courier._maintenance_lease_seconds())."""
DELETE_REAPER_BATCH = 10_000


@dataclass(frozen=True)
class MaintenanceJob:
    name: str
    query: str
    """Named query returning how much it did; repeated while it reports a full batch."""
    every: float
    """Seconds between runs."""
    batch: int | None = None
    """The batch size passed to the query; None for jobs that do everything in one call."""
    runner: Callable[[str, float], int] | None = None
    """Instead of the query: a function of (dsn, time budget) run in a thread on a connection
    of its own, for work a SQL function cannot do (DETACH PARTITION ... CONCURRENTLY)."""
    call: Callable[[psycopg.AsyncConnection], Awaitable[int]] | None = None
    """Instead of the query: a sqlkit call on the leader's own connection."""


@dataclass
class MaintenanceSchedule:
    """How often the leader runs each job, in seconds."""

    election_interval: float = 2.0
    expiry: float = 10.0
    expiry_reaper: float = 60.0
    """queue-ti's expiry reaper: also expires pull messages in processing."""
    delete_reaper_check: float = 60.0
    """How often the delete reaper's own schedule (delete_reaper_schedule, a cron schedule, or
    else delete_reaper_interval) is checked: a schedule's minute is run within this long."""
    stale_recovery: float = 60.0
    dead_worker_recovery: float = 2.0
    """How often the leader looks for workers whose database sessions all ended (killed, or
    their machine gone) and hands their claims back: a dead worker's messages and ordering keys
    wait seconds, not the stale-recovery timeout, which still protects slow live deliveries."""
    archive: float = 2.0
    partitions: float = 3600.0
    dlq_cleanup: float = 3600.0
    event_log_cleanup: float = 3600.0
    schedules: float = 1.0
    """How often the leader sends the due ticks of periodic schedules (courier.run_due_schedules()):
    a tick goes out within about this long of its time, while jobs before it are quick."""
    counter_compaction: float = 60.0
    depth_rebuild: float = 2.0
    """How often the leader checks that the depth counters, unlogged, survived the server's last
    restart; after a crash it counts the queue once (courier.rebuild_queue_depth())."""
    active_estimate: float = 1.0
    """How often the leader writes the active count sends compare with max_queue_size while the
    queue is far below it (courier.estimate_active_messages())."""
    send_stage: float = 1.0
    """How often the leader moves what the claims left in the send stage into the queue and says
    for the next few seconds that a mover is alive, so that single sends stage meanwhile
    (courier.keep_send_stage(), migration 0054)."""
    hot_table_vacuum: float = 5.0
    """How often the leader looks for dead rows in the hot tables (see sqlkit.hot_table_vacuum)."""
    circuit_log: float = 1.0
    """How often the leader logs the circuits that opened or closed since (see circuit_log.py)."""
    metric_samples: float = samples.DEFAULT_INTERVAL
    """Seconds between the samples of depth and outcome totals the console's charts and `courier
    status --history` read (courier.record_metric_samples(); kept for the database setting
    metric_samples_retention_hours, 24 by default). Samples further apart than two of these
    are a gap. 10 s: a five-minute chart gets 30 points, and with ten endpoints an hour of
    samples is about 0.5 MB of table and 1.3 MB of WAL (ARCHITECTURE.md, "Metric samples")."""
    months_ahead: int = 3
    """Archive partitions kept ready beyond the current month."""
    job_time_budget: float = 5.0
    """Longest a batched job may keep going in one run, so one job never starves the rest."""

    def jobs(self) -> list[MaintenanceJob]:
        return [
            MaintenanceJob("schedules", "run_due_schedules", self.schedules, batch=100),
            MaintenanceJob("stale_recovery", "recover_stale_messages", self.stale_recovery),
            MaintenanceJob("dead_worker_recovery", "recover_dead_workers_claims", self.dead_worker_recovery),
            MaintenanceJob("expiry", "mark_expired_messages", self.expiry, batch=10_000),
            MaintenanceJob("expiry_reaper", "run_expiry_reaper", self.expiry_reaper, batch=10_000),
            MaintenanceJob("delete_reaper", "", self.delete_reaper_check, runner=_delete_reaper),
            MaintenanceJob("archive", "archive_finished_messages", self.archive, batch=5_000),
            MaintenanceJob("partitions", "maintain_archive_partitions", self.partitions),
            MaintenanceJob("archive_retention", "cleanup_old_archive_partitions", self.partitions,
                           runner=_drop_expired_partitions),
            MaintenanceJob("dlq_cleanup", "cleanup_dlq", self.dlq_cleanup),
            MaintenanceJob("event_log_cleanup", "cleanup_event_log", self.event_log_cleanup),
            MaintenanceJob("counter_compaction", "compact_queue_depth", self.counter_compaction),
            MaintenanceJob(DEPTH_REBUILD_JOB, "rebuild_queue_depth", self.depth_rebuild),
            # After depth_rebuild: a new leader's first sample after a crash counts the rebuilt depth.
            MaintenanceJob("metric_samples", "", self.metric_samples,
                           call=_quietly(functools.partial(samples.record_async, interval=self.metric_samples))),
            MaintenanceJob("circuit_log", "", self.circuit_log, call=_quietly(CircuitLog())),
            MaintenanceJob("worker_pruning", "prune_workers", self.counter_compaction),
            MaintenanceJob("hot_table_vacuum", "", self.hot_table_vacuum, runner=_vacuum_hot_tables),
        ]

    def send_path_jobs(self) -> list[MaintenanceJob]:
        """What every send reads, kept on a cadence of its own (see MaintenanceLeader._keep_send_path)."""
        return [
            MaintenanceJob("send_stage", "keep_send_stage", self.send_stage),
            MaintenanceJob("active_estimate", "estimate_active_messages", self.active_estimate),
        ]


def _quietly(call: Callable[[psycopg.AsyncConnection], Awaitable[int]]
             ) -> Callable[[psycopg.AsyncConnection], Awaitable[int]]:
    """A job that runs every few seconds and says what it did itself (or nothing worth a line):
    no "maintenance" info line for each run."""
    async def run(conn: psycopg.AsyncConnection) -> int:
        await call(conn)
        return 0
    return run


class MaintenanceLeader:
    def __init__(self, dsn: str, worker_id: str, schedule: MaintenanceSchedule | None = None) -> None:
        self.dsn = dsn
        self.worker_id = worker_id
        self.schedule = schedule or MaintenanceSchedule()
        self.is_leader = False
        self._jobs = self.schedule.jobs()
        self._next_run: dict[str, float] = {}
        self._send_path: asyncio.Task[None] | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        """Campaign, and lead while elected, until stopping is set."""
        while not stopping.is_set():
            conn: psycopg.AsyncConnection | None = None
            try:
                conn = await connect_async(self.dsn, application_name=LEADER_APPLICATION_NAME)
                await self._campaign_and_lead(conn, stopping)
            except CourierError as error:
                if self.is_leader:
                    log.warning("maintenance leadership lost", extra={"worker_id": self.worker_id,
                                                                      "error": error.one_line()})
                await _sleep_unless(stopping, self.schedule.election_interval)
            except Exception:  # a bug must not end maintenance for good: log, step down, retry
                log.exception("maintenance failed; standing down", extra={"worker_id": self.worker_id})
                await _sleep_unless(stopping, self.schedule.election_interval)
            finally:
                self.is_leader = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()  # the session's end frees the lease

    async def _campaign_and_lead(self, conn: psycopg.AsyncConnection, stopping: asyncio.Event) -> None:
        try:
            while not stopping.is_set():
                if not await self._hold_lease(conn):
                    await self._stop_send_path()
                    await _sleep_unless(stopping, self.schedule.election_interval)
                    continue
                await self._run_due_jobs(conn, stopping)
                await _sleep_unless(stopping, 1.0)
        finally:
            await self._stop_send_path()

    async def _hold_lease(self, conn: psycopg.AsyncConnection) -> bool:
        """Takes the maintenance lease, or renews it while leading; False when another worker
        holds it (a leader whose lease expired while it hung learns here that it lost it)."""
        leads = bool(await queries.fetch_value_async(conn, "try_lead_maintenance", {"worker_id": self.worker_id}))
        if leads and not self.is_leader:
            log.info("elected maintenance leader", extra={"worker_id": self.worker_id})
            self._next_run = {}  # a new leader runs everything at once: startup recovery
        elif self.is_leader and not leads:
            log.warning("maintenance lease lost to another worker", extra={"worker_id": self.worker_id})
        self.is_leader = leads
        return leads

    async def _run_due_jobs(self, conn: psycopg.AsyncConnection, stopping: asyncio.Event) -> None:
        for job in self._jobs:
            if stopping.is_set():
                return
            now = time.monotonic()
            if self._next_run.get(job.name, 0.0) > now:
                continue
            # Renewed before every job, so that a leader never starts one after its lease passed.
            if not await self._hold_lease(conn):
                return
            self._next_run[job.name] = now + job.every
            try:
                await self._run_logged(conn, job, stopping)
            finally:
                # The estimate the sends read counts the depth counters: after a crash, once
                # they are rebuilt.
                if job.name == DEPTH_REBUILD_JOB:
                    self._start_send_path(stopping)

    async def _run_logged(self, conn: psycopg.AsyncConnection, job: MaintenanceJob, stopping: asyncio.Event) -> None:
        """Run the job and log what it did; a failure of the job alone is logged, one of the
        connection raised."""
        try:
            done = await self._run_job(conn, job, stopping)
        except CourierError as error:
            if isinstance(error, DatabaseUnavailable) or conn.closed:
                raise  # the connection is gone (the leader's: and the lease with it)
            log.warning("maintenance job failed", extra={"job": job.name, "error": error.one_line()})
            return
        if done:
            log.info("maintenance", extra={"job": job.name, "count": done})

    def _start_send_path(self, stopping: asyncio.Event) -> None:
        if self._send_path is None or self._send_path.done():
            self._send_path = asyncio.create_task(self._keep_send_path(stopping), name="maintenance-send-path")

    async def _stop_send_path(self) -> None:
        task, self._send_path = self._send_path, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _keep_send_path(self, stopping: asyncio.Event) -> None:
        """While this worker leads: the send stage's lease and the estimate of active messages,
        every second on a connection of their own. Every send reads both (send_limits.stage_until
        and room_until, which lapse two seconds after the last estimate); in the jobs' round they
        waited behind the slowest job, and a hot-table VACUUM of five seconds under load sent
        about 30% of the sends down the exact path (BENCHMARKS.md, "The sends while a worker
        drains them")."""
        jobs = self.schedule.send_path_jobs()
        next_run: dict[str, float] = {}
        while not stopping.is_set():
            try:
                async with await connect_async(self.dsn, application_name=LEADER_APPLICATION_NAME) as conn:
                    while not stopping.is_set():
                        for job in jobs:
                            if next_run.get(job.name, 0.0) <= time.monotonic():
                                next_run[job.name] = time.monotonic() + job.every
                                await self._run_logged(conn, job, stopping)
                        await _sleep_unless(stopping, min(job.every for job in jobs))
            except CourierError as error:  # the connection: again after a pause
                log.warning("maintenance job failed", extra={"job": "send_path", "error": error.one_line()})
                await _sleep_unless(stopping, self.schedule.election_interval)

    async def _run_job(self, conn: psycopg.AsyncConnection, job: MaintenanceJob, stopping: asyncio.Event) -> int:
        params = {"batch_size": job.batch, "months_ahead": self.schedule.months_ahead}
        if job.call is not None:
            return await job.call(conn)
        if job.runner is not None:
            # On a connection of its own, and a VACUUM of a big queue can outlast the lease:
            # renewed meanwhile, so that nobody else takes over maintenance under a live leader.
            work = asyncio.ensure_future(asyncio.to_thread(job.runner, self.dsn, self.schedule.job_time_budget))
            while not (await asyncio.wait({work}, timeout=LEASE_RENEWAL_DURING_JOBS))[0]:
                await self._hold_lease(conn)
            return work.result()
        if job.batch is None:
            return await self._retry_lock_waits(conn, job, params, stopping)
        total = 0
        deadline = time.monotonic() + self.schedule.job_time_budget
        while not stopping.is_set() and time.monotonic() < deadline:
            done = int(await queries.fetch_value_async(conn, job.query, params) or 0)
            total += done
            if done < job.batch:
                break
        return total


    async def _retry_lock_waits(self, conn: psycopg.AsyncConnection, job: MaintenanceJob, params: dict[str, object],
                                stopping: asyncio.Event) -> int:
        """The job's query, again after a pause while it gives up on a lock (its DDL waits only
        briefly, so that reports never queue behind it for long), within the job's budget."""
        deadline = time.monotonic() + self.schedule.job_time_budget
        while True:
            try:
                return int(await queries.fetch_value_async(conn, job.query, params) or 0)
            except CourierError as error:
                if error.sqlstate != LOCK_NOT_AVAILABLE or stopping.is_set() or time.monotonic() > deadline:
                    raise
            await _sleep_unless(stopping, LOCK_RETRY_PAUSE)


def _drop_expired_partitions(dsn: str, budget: float) -> int:
    with connect(dsn, application_name=LEADER_APPLICATION_NAME) as conn:
        return drop_expired_partitions(conn, budget=budget)


def _delete_reaper(dsn: str, budget: float) -> int:
    """The delete reaper when its schedule says so, again while it deletes full batches."""
    deadline = time.monotonic() + budget
    total = 0
    with connect(dsn, application_name=LEADER_APPLICATION_NAME) as conn:
        while True:
            done = run_delete_reaper_if_scheduled(conn, DELETE_REAPER_BATCH)
            total += done
            if done < DELETE_REAPER_BATCH or time.monotonic() > deadline:
                return total


def _vacuum_hot_tables(dsn: str, budget: float) -> int:
    with connect(dsn, application_name=LEADER_APPLICATION_NAME) as conn:
        return vacuum_hot_tables(conn)


async def _sleep_unless(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
