"""The worker pool: one claim loop per enabled endpoint, dispatch under a global and a
per-endpoint concurrency limit, and outcomes reported to SQL in batches.

Wake-ups come from LISTEN courier_new_msg. Of the producers committing together only one
NOTIFYs, so after a wake-up a loop that comes back empty lingers: it claims again within
milliseconds for as long as producers of its endpoint are still committing, then once more.
Every loop also polls, for scheduled and retried messages and for anything a lost
notification would strand. The same pool runs headless
under `courier worker` and embedded in the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import defaultdict

from sqlkit import queries
from sqlkit.connection import AsyncDatabase
from sqlkit.errors import CourierError
from sqlkit.messages import ClaimedMessage, claimed_from_row
from sqlkit.stopping import cancel_within, within

from .capacity import Capacity
from .dispatchers import Target
from .dispatching import Deliveries
from .faults import call_with_retry, one_line
from .leases import Leases
from .maintenance import MaintenanceLeader
from .outcome import Outcome
from .prefetch import Prefetch
from .reporting import Reporter, report_params
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
        self._targets: dict[int, Target] = {}
        self._loops: dict[int, asyncio.Task[None]] = {}
        self._wake: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        # Set while an endpoint's claims come back full: its extra claimers work only then.
        self._busy: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self._capacity = Capacity()
        # Slots reserved by claims on their way to the database, in total and by endpoint.
        self._claiming = 0
        self._claiming_by_endpoint: dict[int, int] = defaultdict(int)
        self._leases = Leases(self._db)
        self.reporter = Reporter(self._db, self.settings, self.stats, self._capacity, self._leases, self._stopping,
                                 wake=lambda endpoint_id: self._wake[endpoint_id].set(),
                                 busy=lambda: any(busy.is_set() for busy in self._busy.values()))
        self.prefetch = Prefetch(self._leases, self._capacity, wake=lambda endpoint_id: self._wake[endpoint_id].set())
        self._db_settings: dict[str, str] = {}
        self.deliveries = Deliveries(self.settings, self._capacity, self._leases, self.prefetch, self.reporter,
                                     current=self._current, target=self._target,
                                     db_settings=lambda: self._db_settings)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat_due = asyncio.Event()
        self._resizes: set[asyncio.Task[None]] = set()
        self.maintenance = None if self.settings.maintenance is None else MaintenanceLeader(
            dsn, self.settings.worker_id, self.settings.maintenance)

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id

    def stop(self) -> None:
        """Begin a graceful stop: no new claims; in-flight messages finish and are reported."""
        self._stopping.set()
        for event in [*self._wake.values(), *self._busy.values()]:
            event.set()

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
            reporter = asyncio.create_task(self.reporter.run(self.deliveries.idle), name="reporter")
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
            if not await within(self.settings.drain_timeout + DRAIN_GRACE, self._drain_and_report(reporter),
                                "the drain"):
                log.error("drain timed out; what is still claimed is recovered once this worker has exited",
                          extra={"worker_id": self.worker_id, "unreported": len(self.reporter.waiting())})
                await cancel_within([reporter], STOP_STEP)
        finally:
            await asyncio.gather(  # in this order: the periodic heartbeat is cancelled before the last one starts
                cancel_within(background, STOP_STEP),
                within(STOP_STEP, self._heartbeat("stopped"), "the last heartbeat"),
                # a broker or a session that hangs cannot hold the stop
                within(STOP_STEP, self.deliveries.close(), "closing dispatchers"))
            await within(STOP_STEP, self._db.close(), "closing the connection pool")
            log.info("worker stopped", extra={"worker_id": self.worker_id, "delivered": self.stats.delivered,
                                              "failed": self.stats.failed})

    async def _drain_and_report(self, reporter: asyncio.Task[None]) -> None:
        deadline = time.monotonic() + self.settings.drain_timeout
        await within(STOP_STEP, self._heartbeat("draining"), "the draining heartbeat")
        await self._wake_all_loops()
        await asyncio.gather(*self._loops.values(), return_exceptions=True)
        await self.prefetch.release_all()
        await self.deliveries.drain(deadline)
        self.reporter.wake()
        await reporter

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
            self._wake[endpoint_id].set()
            self._busy[endpoint_id].set()  # its idle claimers look, and end
        await self._capacity.notify()
        await self.deliveries.refresh(current)
        if self._stopping.is_set():
            return
        for endpoint_id, target in current.items():
            running = self._loops.get(endpoint_id)
            if (running is None or running.done()) and self.deliveries.dispatcher(target.protocol) is not None:
                self._loops[endpoint_id] = asyncio.create_task(self._endpoint_loop(target), name=f"claim-{target.name}")

    async def _endpoint_loop(self, target: Target) -> None:
        """The endpoint's claimers: the first polls; the others join in only while claims
        come back full, so a busy endpoint has a claim on its way while the previous one is
        in the database, and an idle one costs one poll per interval.

        An endpoint dispatched one message at a time (HTTP) has one claimer: its prefetch
        covers a claim's round trip instead. Two claims on their way at once split the next
        messages between them in an order neither knows (the one that carries reports, or
        waits on a lock, takes its rows later), and whichever answered first went out first:
        with one request at a time a webhook saw 7,7,6,6,5,5,6,6. One claim after another,
        each takes the highest of what the previous left, and the prefetch, first in first
        out, sends messages that were pending together in priority order."""
        busy = self._busy[target.id]
        busy.clear()
        dispatcher = self.deliveries.dispatcher(target.protocol)
        claimers = self.settings.claimers if dispatcher is not None and dispatcher.batched else 1
        await asyncio.gather(*(self._claim_loop(target, busy, eager=n > 0) for n in range(max(1, claimers))))

    async def _claim_loop(self, target: Target, busy: asyncio.Event, eager: bool) -> None:
        wake = self._wake[target.id]
        failures = 0
        linger = _Linger(self.settings.linger, self.settings.linger_limit)
        while self._current(target):
            if eager and not busy.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(busy.wait(), self.settings.poll_interval)
                continue
            room = await self._room(target)
            if not self._current(target):
                self._unreserve(target.id, room)
                return
            if wake.is_set():
                linger.start()
            wake.clear()
            try:
                claimed = await self._claim(target.id, room)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as error:  # never let one endpoint's claim loop die
                failures += 1
                log.warning("claim failed", extra={"endpoint": target.name, "error": one_line(error)})
                await asyncio.sleep(min(0.2 * 2**failures, 5.0))
                continue
            finally:
                self._unreserve(target.id, room)
            if len(claimed) >= room:
                busy.set()
            else:
                busy.clear()
            if not claimed:
                pause = await self._linger_pause(target, linger)
                if pause is None:
                    pause = self.settings.poll_interval
                if pause:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), pause)
                continue
            dispatcher = self.deliveries.dispatcher(target.protocol)
            if dispatcher is None:  # cannot happen: loops start only for protocols with one
                continue
            if dispatcher.batched:
                self.deliveries.start_batch(target, claimed)
                # One turn of the event loop before the next claim: a dispatcher that is
                # done at once (noop) records its outcomes in it, and that claim carries them,
                # instead of the reporter sending them in a round trip of their own.
                await asyncio.sleep(0)
            else:
                self.prefetch.add(target.id, claimed)
                self.deliveries.pump(target)

    async def _linger_pause(self, target: Target, linger: _Linger) -> float | None:
        """After an empty claim: the pause before the linger's next claim, or None if the
        loop is not lingering (any more) and waits for a wake-up or the poll."""
        if not linger.active or linger.final:
            linger.stop()
            return None
        try:
            self.stats.round_trips += 1
            async with self._db.connection() as conn:
                committing = await queries.fetch_value_async(conn, "sends_committing", {"endpoint_id": target.id})
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the poll still finds whatever the linger would have
            log.info("linger check failed", extra={"endpoint": target.name, "error": one_line(error)})
            linger.stop()
            return None
        return linger.next_pause(bool(committing))

    def _current(self, target: Target) -> bool:
        """Whether the endpoint is still served as it is: the pool is not stopping, and the
        endpoint was not disabled, dropped or reconfigured."""
        return not self._stopping.is_set() and self._targets.get(target.id) == target

    def _target(self, endpoint_id: int) -> Target | None:
        return self._targets.get(endpoint_id)

    async def _wake_all_loops(self) -> None:
        for event in [*self._wake.values(), *self._busy.values()]:
            event.set()
        await self._capacity.notify()

    async def _room(self, target: Target) -> int:
        """Wait until this endpoint may take at least one more message; return how many
        (0 when the pool is stopping). An endpoint with failures not yet reported gets no
        room, so that a circuit they open stops its next claim, not the one after.

        An endpoint dispatched one message at a time may also hold a prefetch of claimed
        messages beyond its in-flight limit (see Prefetch); it claims again when half of
        that prefetch is gone, so a busy webhook pays one round trip per half batch."""
        async with self._capacity:
            while not self._stopping.is_set():
                # Read on every wake-up: resize() changes the pool's concurrency, which is
                # also the default limit of an endpoint without its own config.concurrency.
                limit = self.deliveries.limit(target)
                prefetch = self.deliveries.prefetch_size(target, limit)
                # Slots reserved by claims on their way count as taken.
                held = (self.deliveries.in_flight_to(target.id) + self._claiming_by_endpoint[target.id]
                        + self.prefetch.held(target.id))
                room = min(self.settings.batch_size,
                           self.settings.concurrency + prefetch - self.deliveries.in_flight_count - self._claiming
                           - self.prefetch.total(),
                           limit + prefetch - held)
                if prefetch:
                    enough = 1 if held == 0 else max(1, prefetch // 2)
                else:
                    # A claim for one freed slot costs a round trip per message: while the
                    # endpoint is busy, wait until a quarter of its budget (or a batch) is free.
                    enough = 1 if held == 0 else max(1, min(self.settings.batch_size, limit // 4,
                                                            self.settings.concurrency // 4))
                if (room >= enough and not self.reporter.has_unreported_failure(target.id)
                        and self.reporter.unreported() < self.settings.max_unreported):
                    self._claiming += room
                    self._claiming_by_endpoint[target.id] += room
                    return room
                await self._capacity.wait()
            return 0

    def _woken_here(self, target: Target) -> bool:
        """Whether a NOTIFY for the endpoint wakes this pool. When several pools make up the
        worker (--processes), one of those with a share of the endpoint answers it, so that a
        message sent to a quiet endpoint costs one claim rather than one per pool, each
        competing with the producers for the database. (At 1,000 sends/s offered on two cores,
        the producers got 570-590/s through with two pools that both answered, 660-770/s with
        one answering, and 950-1,000/s with a single pool: every pool still receives every
        NOTIFY.) The others find the endpoint's messages at their poll, and keep claiming while
        their claims come back full."""
        share = self.settings.share
        if share.count == 1:
            return True
        configured = target.config.get("concurrency")
        total = int(configured) if configured is not None else (
            HTTP_DEFAULT_CONCURRENCY if target.protocol == "http" else share.count)
        return target.id % max(1, min(share.count, total)) == share.index

    def _unreserve(self, endpoint_id: int, room: int) -> None:
        """Give back the slots _room reserved for a claim, now that its messages (if any)
        count as in flight; the part it did not fill is free for others again."""
        self._claiming -= room
        self._claiming_by_endpoint[endpoint_id] -= room
        if room:
            self._capacity.notify_soon()

    async def _claim(self, endpoint_id: int, room: int) -> list[ClaimedMessage]:
        """Claim for one endpoint, reporting the outcomes held so far in the same round trip
        (and the same commit). If that fails, the outcomes go back to the reporter, which
        retries them or isolates a bad one, and the claim goes alone."""
        batch = self.reporter.take()
        params = {"worker_id": self.worker_id, "batch_size": room, "endpoint_id": endpoint_id}
        try:
            self.stats.round_trips += 1
            async with self._db.connection() as conn:
                rows = await queries.fetch_all_async(conn, "report_and_claim", {**params, **report_params(batch)})
        except BaseException as error:
            self.reporter.give_back(batch, error)
            if not batch or not isinstance(error, Exception):
                raise
            # The outcomes may be what failed (refused, or waiting on a lock): the reporter
            # retries or isolates them, and a claim does not wait for it. If the database
            # is away, this claim fails too.
            log.info("report with claim failed; reporting separately", extra={"error": one_line(error)})
            self.reporter.wake()
            self.stats.round_trips += 1
            async with self._db.connection() as conn:
                rows = await queries.fetch_all_async(conn, "claim_for_endpoint", params)
        else:
            await self.reporter.reported(batch, rows)
        now = time.monotonic()
        claimed = []
        for row in rows:
            if row["id"] is None:  # report-and-claim's row of counts, when nothing was claimed
                continue
            self._leases.taken(row["id"], now)
            try:
                claimed.append(claimed_from_row(row))
            except Exception as error:  # RecursionError, bad JSON: this message fails alone
                log.error("claimed message cannot be decoded",
                          extra={"message_id": row["id"], "error": one_line(error)})
                undecodable = claimed_from_row({**row, "headers": "{}", "metadata": "{}"})
                self.reporter.add(undecodable, Outcome.permanent(
                    f"the worker cannot decode this message's headers or metadata: {one_line(error)[:200]}"))
        return claimed

    async def _renew_leases(self) -> None:
        """Renew the leases of deliveries (and unreported outcomes) held for a third of the
        stale-recovery timeout, so recovery never takes a slow delivery from a live worker."""
        renew_after = self.settings.renew_after
        if renew_after is None:
            renew_after = float(self._db_settings.get("stale_recovery_timeout", "60")) / 3
        await self._leases.renew([*self.deliveries.in_flight_messages(), *self.prefetch.messages(),
                                  *self.reporter.waiting()], renew_after)

    # Housekeeping ----------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        while True:
            try:
                async with self._db.listen() as notifications:
                    # Anything sent while we were not listening: look now.
                    for event in self._wake.values():
                        event.set()
                    async for payload in notifications:
                        if payload.isdigit():
                            target = self._targets.get(int(payload))
                            if target is None or self._woken_here(target):
                                self._wake[int(payload)].set()
                        else:
                            for event in self._wake.values():
                                event.set()
            except CourierError as error:
                log.warning("LISTEN connection lost; reconnecting", extra={"error": error.one_line()})
                await asyncio.sleep(1.0)

    async def _register_session(self, conn) -> None:
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
            })

    async def _every(self, seconds: float, action, due: asyncio.Event | None = None) -> None:
        """Run action (() -> Awaitable[None]) every `seconds`, or sooner when `due` is set."""
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


class _Linger:
    """One claim loop's linger after a wake-up. A claim that comes back empty asks whether
    producers of the endpoint are still committing: while some are, claim again after the next
    pause; once none is, one more claim at once sees every commit that was under way, and an
    empty claim after that ends the linger."""

    def __init__(self, pauses: tuple[float, ...], limit: float) -> None:
        self._pauses = pauses
        self._limit = limit
        self._step = 0
        self._until = 0.0
        self.active = False
        self.final = False

    def start(self) -> None:
        self.active = bool(self._pauses)
        self.final = False
        self._step = 0
        self._until = time.monotonic() + self._limit

    def stop(self) -> None:
        self.active = False

    def next_pause(self, committing: bool) -> float | None:
        """Seconds to wait before the next claim, or None when the linger is over."""
        if not committing:
            self.final = True
            return 0.0
        if time.monotonic() > self._until:
            self.active = False
            return None
        pause = self._pauses[min(self._step, len(self._pauses) - 1)]
        self._step += 1
        return pause
