"""The worker pool: builds the stages a message goes through (claims, prefetch, deliveries,
reporter) and owns their lifecycle: start, resize, endpoint refresh, LISTEN, heartbeats,
lease renewal and the bounded stop.

One claim loop per enabled endpoint, dispatch under a global and a per-endpoint concurrency
limit, and outcomes reported to SQL in batches. Wake-ups come from LISTEN courier_new_msg.
Of the producers committing together only one NOTIFYs, so after a wake-up a loop that comes
back empty lingers: it claims again within milliseconds for as long as producers of its
endpoint are still committing, then once more. Every loop also polls, for scheduled and
retried messages and for anything a lost notification would strand. The same pool runs
headless under `courier worker` and embedded in the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

import psycopg

from sqlkit import queries
from sqlkit.connection import AsyncDatabase
from sqlkit.errors import CourierError
from sqlkit.stopping import cancel_within, within

from ..extras import deliverable_protocols
from .capacity import Capacity
from .claiming import Claims, Wakeups
from .dispatchers import Target
from .dispatching import Deliveries
from .faults import call_with_retry, one_line
from .leases import Leases
from .maintenance import MaintenanceLeader
from .prefetch import Prefetch
from .reporting import Reporter
from .settings import (
    HTTP_DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY,
    PoolSettings,
    PoolStats,
    Share,
    default_concurrency,
)

__all__ = ["DRAIN_GRACE", "HTTP_DEFAULT_CONCURRENCY", "MAX_CONCURRENCY", "STOP_STEP", "PoolSettings", "PoolStats",
           "Share", "WorkerPool", "default_concurrency"]

log = logging.getLogger("courier.worker")

DRAIN_GRACE = 5.0
"""Seconds a stop may take beyond the drain timeout, to release and report. With the last
heartbeat, closing the connections and (in `courier worker`) the process's teardown, each
STOP_STEP at most, a stop takes at most drain_timeout + 8 s."""

STOP_STEP = 1.0
"""Seconds each step after the drain may take before the stop goes on without it."""


class WorkerPool:
    def __init__(self, dsn: str, settings: PoolSettings | None = None) -> None:
        self.settings = settings or PoolSettings()
        self.stats = PoolStats()
        # This process, as against an earlier one under the same worker id (a fixed --worker-id).
        self._incarnation = uuid.uuid4().hex
        # Every session registers itself, so that the maintenance leader sees this process die
        # with its sessions and recovers its claims at once (recover_dead_workers_claims).
        self._db = AsyncDatabase(dsn, min_size=2, max_size=8, application_name="courier-worker",
                                 configure=self._register_session)
        self._stopping = asyncio.Event()
        # Set at a stop once the claim loops have ended and the deliveries are drained: from then
        # on no outcome can be recorded, and the report loop ends once it has sent the last one.
        self._drained = asyncio.Event()
        self._targets: dict[int, Target] = {}
        self._db_settings: dict[str, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat_due = asyncio.Event()
        self._resizes: set[asyncio.Task[None]] = set()
        self.maintenance = None if self.settings.maintenance is None else MaintenanceLeader(
            dsn, self.settings.worker_id, self.settings.maintenance)
        # The stages, along a message's path: claimed (and maybe prefetched), delivered, reported.
        self._capacity = Capacity()
        self._leases = Leases(self._db)
        self._wakeups = Wakeups()
        self.reporter = Reporter(self._db, self.settings, self.stats, self._capacity, self._leases, self._stopping,
                                 wake=self._wakeups.wake, busy=self._wakeups.any_busy)
        self.prefetch = Prefetch(self._leases, self._capacity, wake=self._wakeups.wake)
        self.deliveries = Deliveries(self.settings, self._capacity, self._leases, self.prefetch, self.reporter,
                                     current=self._current, target=self._target,
                                     db_settings=lambda: self._db_settings)
        self.claims = Claims(self._db, self.settings, self.stats, self._capacity, self._leases, self._wakeups,
                             self.prefetch, self.deliveries, self.reporter, self._stopping, current=self._current)

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id

    def stop(self) -> None:
        """Begin a graceful stop: no new claims; in-flight messages finish and are reported."""
        self._stopping.set()
        self._wakeups.rouse_all()

    def stop_threadsafe(self) -> None:
        """stop(), from a thread other than the one running the pool."""
        if self._loop is None:
            self._stopping.set()  # not running yet: run() will find it set and stop at once
        else:
            self._loop.call_soon_threadsafe(self.stop)

    def resize(self, concurrency: int) -> None:
        """Change how many messages may be in flight at once, live. Scaling up claims more at
        once; scaling down lets in-flight deliveries finish and claims nothing new until the
        pool is under the new limit. Call from the pool's event loop (or before run())."""
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be between 1 and {MAX_CONCURRENCY}, not {concurrency}")
        self.settings.concurrency = concurrency
        if self._loop is None:
            return
        log.info("resized", extra={"worker_id": self.worker_id, "concurrency": concurrency})
        self._heartbeat_due.set()  # the new concurrency shows in courier.workers at once
        task = asyncio.create_task(self._wake_all_loops())
        self._resizes.add(task)
        task.add_done_callback(self._resizes.discard)

    def resize_threadsafe(self, concurrency: int) -> None:
        """resize(), from a thread other than the one running the pool."""
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be between 1 and {MAX_CONCURRENCY}, not {concurrency}")
        loop = self._loop
        if loop is None or loop.is_closed():
            self.settings.concurrency = concurrency
        else:
            loop.call_soon_threadsafe(self.resize, concurrency)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._db.open(timeout=30)
        background: list[asyncio.Task[None]] = []
        try:
            await call_with_retry(self._heartbeat)  # the leader election records itself on this row
            await self._refresh_targets()
            report_loop = asyncio.create_task(self.reporter.run(self._drained.is_set), name="reporter")
            background = [
                asyncio.create_task(self._listen_loop(), name="listen"),
                asyncio.create_task(self._every(self.settings.refresh_interval, self._refresh_targets), name="refresh"),
                asyncio.create_task(self._every(self.settings.heartbeat_interval, self._heartbeat, self._heartbeat_due),
                                    name="heartbeat"),
                asyncio.create_task(self._every(self.settings.heartbeat_interval, self._renew_leases),
                                    name="lease-renewal"),
            ]
            if self.maintenance is not None:
                # Stale recovery at start-up is the leader's first job, as for ulak's worker 0.
                background.append(asyncio.create_task(self.maintenance.run(self._stopping), name="maintenance"))
            log.info("worker started", extra={"worker_id": self.worker_id, "concurrency": self.settings.concurrency})
            await self._stopping.wait()
            log.info("draining", extra={"worker_id": self.worker_id, "in_flight": self.deliveries.in_flight_count})
            # Bounded by the drain timeout plus DRAIN_GRACE for the release and the last reports,
            # whatever the database does: a heartbeat, release or report that fails or hangs is
            # logged and left behind, and the stop goes on.
            if not await within(self.settings.drain_timeout + DRAIN_GRACE, self._drain_and_report(report_loop),
                                "the drain"):
                log.error("drain timed out; what is still claimed is recovered once this worker has exited",
                          extra={"worker_id": self.worker_id, "unreported": len(self.reporter.waiting())})
                await cancel_within([report_loop], STOP_STEP)
        finally:
            await asyncio.gather(  # in this order: the periodic heartbeat is cancelled before the last one starts
                cancel_within(background, STOP_STEP),
                within(STOP_STEP, self._heartbeat("stopped"), "the last heartbeat"),
                # a broker or a session that hangs cannot hold the stop
                within(STOP_STEP, self.deliveries.close(), "closing dispatchers"))
            await within(STOP_STEP, self._db.close(), "closing the connection pool")
            log.info("worker stopped", extra={"worker_id": self.worker_id, "delivered": self.stats.delivered,
                                              "failed": self.stats.failed})

    async def _drain_and_report(self, report_loop: asyncio.Task[None]) -> None:
        deadline = time.monotonic() + self.settings.drain_timeout
        await within(STOP_STEP, self._heartbeat("draining"), "the draining heartbeat")
        await self._wake_all_loops()
        await self.claims.finish()
        await self.prefetch.release_all()
        await self.deliveries.drain(deadline)
        self._drained.set()
        self.reporter.wake()
        await report_loop

    async def _wake_all_loops(self) -> None:
        self._wakeups.rouse_all()
        await self._capacity.notify()

    # Endpoints -------------------------------------------------------------------------

    async def _refresh_targets(self) -> None:
        async with self._db.connection() as conn:
            rows = await queries.fetch_all_async(conn, "dispatch_targets")
            self._db_settings = {row["name"]: row["value"]
                                 for row in await queries.fetch_all_async(conn, "setting_values")}
        current = {row["id"]: Target(row["id"], row["name"], row["protocol"], row["config"]) for row in rows}
        changed = [i for i in self._targets if current.get(i) != self._targets[i]]
        self._targets = current
        # A loop whose endpoint was disabled, dropped or reconfigured notices and ends after
        # its claim in progress (a cancelled claim could strand claimed messages); the next
        # refresh starts a loop with the new configuration.
        for endpoint_id in changed:
            self._wakeups.rouse(endpoint_id)  # its idle claimers look, and end
        await self._capacity.notify()
        await self.deliveries.refresh(current)
        if self._stopping.is_set():
            return
        for target in current.values():
            self.claims.serve(target)

    def _current(self, target: Target) -> bool:
        """Whether the endpoint is still served as it is: the pool is not stopping, and the
        endpoint was not disabled, dropped or reconfigured."""
        return not self._stopping.is_set() and self._targets.get(target.id) == target

    def _target(self, endpoint_id: int) -> Target | None:
        return self._targets.get(endpoint_id)

    def _woken_here(self, target: Target) -> bool:
        """Whether a NOTIFY for the endpoint wakes this pool. When several pools make up the
        worker (--processes), one of those with a share of the endpoint answers it, so that a
        message sent to a quiet endpoint costs one claim rather than one per pool, each
        competing with the producers for the database. (At 1,000 sends/s offered on two cores,
        the producers got 570-590/s through with two pools that both answered, 660-770/s with
        one answering, and 950-1,000/s with a single pool: every pool still receives every
        NOTIFY.) The others find the endpoint's messages at their poll, and keep claiming until a
        claim comes back empty. Claiming only while claims came back full was measured (2026-12-01)
        and moved the number of claims by nothing at 500 sends/s."""
        share = self.settings.share
        if share.count == 1:
            return True
        configured = target.config.get("concurrency")
        total = int(configured) if configured is not None else (
            HTTP_DEFAULT_CONCURRENCY if target.protocol == "http" else share.count)
        return target.id % max(1, min(share.count, total)) == share.index

    # Housekeeping ----------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        while True:
            try:
                async with self._db.listen() as notifications:
                    # Anything sent while we were not listening: look now.
                    self._wakeups.wake_all()
                    async for payload in notifications:
                        if payload.isdigit():
                            target = self._targets.get(int(payload))
                            if target is None or self._woken_here(target):
                                self._wakeups.wake(int(payload))
                        else:
                            self._wakeups.wake_all()
            except CourierError as error:
                log.warning("LISTEN connection lost; reconnecting", extra={"error": error.one_line()})
                await asyncio.sleep(1.0)

    async def _register_session(self, conn: psycopg.AsyncConnection) -> None:
        await queries.fetch_value_async(conn, "register_worker_session", {
            "worker_id": self.worker_id, "incarnation": self._incarnation})

    async def _heartbeat(self, state: str | None = None) -> None:
        state = state or ("draining" if self._stopping.is_set() else "running")
        async with self._db.connection() as conn:
            await self._register_session(conn)  # a no-op unless a pooler moved us to another session
            await queries.fetch_value_async(conn, "worker_heartbeat", {
                "worker_id": self.worker_id, "hostname": socket.gethostname(), "pid": os.getpid(),
                "concurrency": self.settings.concurrency, "in_flight": self.deliveries.in_flight_count,
                "delivered": self.stats.delivered, "failed": self.stats.failed, "state": state,
                "protocols": deliverable_protocols(),
            })

    async def _renew_leases(self) -> None:
        """Renew the leases of deliveries (and unreported outcomes) held for a third of the
        stale-recovery timeout, so recovery never takes a slow delivery from a live worker."""
        renew_after = self.settings.renew_after
        if renew_after is None:
            renew_after = float(self._db_settings.get("stale_recovery_timeout", "60")) / 3
        await self._leases.renew([*self.deliveries.in_flight_messages(), *self.prefetch.messages(),
                                  *self.reporter.waiting()], renew_after)

    async def _every(self, seconds: float, action: Callable[[], Awaitable[None]],
                     due: asyncio.Event | None = None) -> None:
        """Run action every `seconds`, or sooner when `due` is set."""
        while True:
            if due is None:
                await asyncio.sleep(seconds)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(due.wait(), seconds)
                due.clear()
            try:
                await action()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("periodic task failed", extra={"task": action.__name__, "error": one_line(error)})
