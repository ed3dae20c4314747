"""The worker pool: one claim loop per enabled endpoint, dispatch under a global and a
per-endpoint concurrency limit, and outcomes reported to SQL in batches.

Wake-ups come from LISTEN courier_new_msg; every loop also polls, for scheduled and retried
messages and for anything a lost notification would strand. The same pool runs headless
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
from dataclasses import dataclass, field

from sqlkit import queries
from sqlkit.connection import AsyncDatabase
from sqlkit.errors import CourierError
from sqlkit.messages import ClaimedMessage

from .dispatchers import Dispatcher, Target, dispatcher_for
from .maintenance import MaintenanceLeader, MaintenanceSchedule
from .outcome import Outcome, OutcomeKind

log = logging.getLogger("courier.worker")

MAX_CONCURRENCY = 10_000
"""The most messages one pool may have in flight (as `courier worker --concurrency` allows)."""


@dataclass
class PoolSettings:
    concurrency: int = 16
    """Messages in flight at once across all endpoints."""
    batch_size: int = 50
    """Most messages one claim takes."""
    poll_interval: float = 1.0
    """Seconds between claims of an idle endpoint when no notification arrives."""
    report_interval: float = 0.02
    """Seconds outcomes may wait to be reported together."""
    drain_timeout: float = 30.0
    """Seconds a graceful stop waits for in-flight deliveries before releasing them."""
    refresh_interval: float = 2.0
    """Seconds between re-reads of the endpoint list."""
    heartbeat_interval: float = 5.0
    maintenance: MaintenanceSchedule | None = field(default_factory=MaintenanceSchedule)
    """The schedule this pool runs if it is elected maintenance leader; None never stands."""
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}")


@dataclass
class PoolStats:
    delivered: int = 0
    failed: int = 0
    dead_lettered: int = 0


class WorkerPool:
    def __init__(self, dsn: str, settings: PoolSettings | None = None) -> None:
        self.settings = settings or PoolSettings()
        self.stats = PoolStats()
        self._db = AsyncDatabase(dsn, min_size=2, max_size=8, application_name="courier-worker")
        self._stopping = asyncio.Event()
        self._targets: dict[int, Target] = {}
        self._loops: dict[int, asyncio.Task[None]] = {}
        self._wake: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self._dispatchers: dict[str, Dispatcher | None] = {}
        self._in_flight: dict[int, ClaimedMessage] = {}
        self._in_flight_by_endpoint: dict[int, int] = defaultdict(int)
        self._dispatch_tasks: set[asyncio.Task[None]] = set()
        self._capacity = asyncio.Condition()
        self._reports: list[tuple[int, Outcome]] = []
        self._report_wake = asyncio.Event()
        # Failures not yet reported, by endpoint: until SQL has seen them it cannot open the
        # circuit, so the endpoint gets no more room until they are (see _room).
        self._unreported_failures: dict[int, int] = defaultdict(int)
        self._failed_endpoint: dict[int, int] = {}
        self._db_settings: dict[str, str] = {}
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
        for event in self._wake.values():
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
            await self._call_with_retry(self._heartbeat)  # the leader election records itself on this row
            await self._refresh_targets()
            reporter = asyncio.create_task(self._report_loop(), name="reporter")
            background = [
                asyncio.create_task(self._listen_loop(), name="listen"),
                asyncio.create_task(self._every(self.settings.refresh_interval, self._refresh_targets), name="refresh"),
                asyncio.create_task(self._every(self.settings.heartbeat_interval, self._heartbeat, self._heartbeat_due),
                                    name="heartbeat"),
            ]
            if self.maintenance is not None:
                # Stale recovery at start-up is the leader's first job, as for ulak's worker 0.
                background.append(asyncio.create_task(self.maintenance.run(self._stopping), name="maintenance"))
            log.info("worker started", extra={"worker_id": self.worker_id, "concurrency": self.settings.concurrency})
            await self._stopping.wait()
            log.info("draining", extra={"worker_id": self.worker_id, "in_flight": len(self._in_flight)})
            await self._heartbeat("draining")
            await self._wake_all_loops()
            await asyncio.gather(*self._loops.values(), return_exceptions=True)
            await self._drain()
            self._report_wake.set()
            await reporter
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._heartbeat("stopped")
            for dispatcher in self._dispatchers.values():
                if dispatcher is not None:
                    await dispatcher.close()
            await self._db.close()
            log.info("worker stopped", extra={"worker_id": self.worker_id, "delivered": self.stats.delivered,
                                              "failed": self.stats.failed})

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
        async with self._capacity:
            self._capacity.notify_all()
        if self._stopping.is_set():
            return
        for endpoint_id, target in current.items():
            running = self._loops.get(endpoint_id)
            if (running is None or running.done()) and self._dispatcher(target.protocol) is not None:
                self._loops[endpoint_id] = asyncio.create_task(self._endpoint_loop(target), name=f"claim-{target.name}")

    def _dispatcher(self, protocol: str) -> Dispatcher | None:
        if protocol not in self._dispatchers:
            self._dispatchers[protocol] = dispatcher_for(protocol, self._db_settings)
            if self._dispatchers[protocol] is None:
                log.warning("no dispatcher for protocol; its messages stay queued", extra={"protocol": protocol})
        return self._dispatchers[protocol]

    async def _endpoint_loop(self, target: Target) -> None:
        wake = self._wake[target.id]
        failures = 0
        while self._current(target):
            room = await self._room(target)
            if not self._current(target):
                return
            wake.clear()
            try:
                claimed = await self._claim(target.id, room)
                failures = 0
            except CourierError as error:
                failures += 1
                log.warning("claim failed", extra={"endpoint": target.name, "error": error.one_line()})
                await asyncio.sleep(min(0.2 * 2**failures, 5.0))
                continue
            if not claimed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.settings.poll_interval)
                continue
            for message in claimed:
                self._start_dispatch(target, message)

    def _current(self, target: Target) -> bool:
        return not self._stopping.is_set() and self._targets.get(target.id) == target

    async def _wake_all_loops(self) -> None:
        for event in self._wake.values():
            event.set()
        async with self._capacity:
            self._capacity.notify_all()

    async def _room(self, target: Target) -> int:
        """Wait until this endpoint may take at least one more message; return how many
        (0 when the pool is stopping). An endpoint with failures not yet reported gets no
        room, so that a circuit they open stops its next claim, not the one after."""
        async with self._capacity:
            while not self._stopping.is_set():
                # Read on every wake-up: resize() changes the pool's concurrency, which is
                # also the default limit of an endpoint without its own config.concurrency.
                limit = int(target.config.get("concurrency", self.settings.concurrency))
                room = min(self.settings.batch_size,
                           self.settings.concurrency - len(self._in_flight),
                           limit - self._in_flight_by_endpoint[target.id])
                if room > 0 and self._unreported_failures[target.id] == 0:
                    return room
                await self._capacity.wait()
            return 0

    async def _claim(self, endpoint_id: int, room: int) -> list[ClaimedMessage]:
        async with self._db.connection() as conn:
            rows = await queries.fetch_all_async(conn, "claim_for_endpoint", {
                "worker_id": self.worker_id, "batch_size": room, "endpoint_id": endpoint_id})
        return [ClaimedMessage(**row) for row in rows]

    # Dispatch and outcomes -------------------------------------------------------------

    def _start_dispatch(self, target: Target, message: ClaimedMessage) -> None:
        self._in_flight[message.id] = message
        self._in_flight_by_endpoint[target.id] += 1
        task = asyncio.create_task(self._dispatch(target, message))
        self._dispatch_tasks.add(task)
        task.add_done_callback(self._dispatch_tasks.discard)

    async def _dispatch(self, target: Target, message: ClaimedMessage) -> None:
        dispatcher = self._dispatcher(target.protocol)
        assert dispatcher is not None
        try:
            outcome = await dispatcher.deliver(target, message)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a dispatcher bug must not lose the message
            log.exception("dispatcher raised", extra={"endpoint": target.name, "message_id": message.id})
            outcome = Outcome.retryable(f"dispatcher error: {type(error).__name__}: {error}")
        if outcome.kind != OutcomeKind.SUCCESS:
            self._unreported_failures[target.id] += 1
            self._failed_endpoint[message.id] = target.id
        self._reports.append((message.id, outcome))
        self._report_wake.set()
        self._in_flight.pop(message.id, None)
        self._in_flight_by_endpoint[target.id] -= 1
        async with self._capacity:
            self._capacity.notify_all()

    async def _report_loop(self) -> None:
        failures = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._report_wake.wait(), 1.0)
            self._report_wake.clear()
            await asyncio.sleep(self.settings.report_interval)  # let a batch gather
            while self._reports:
                batch = self._reports[:500]
                try:
                    await self._report(batch)
                    failures = 0
                except CourierError as error:
                    failures += 1
                    log.warning("reporting outcomes failed; will retry",
                                extra={"pending_reports": len(self._reports), "error": error.one_line()})
                    await asyncio.sleep(min(0.2 * 2**failures, 5.0))
                    continue
                del self._reports[: len(batch)]
            if self._stopping.is_set() and not self._in_flight and not self._dispatch_tasks:
                return

    async def _report(self, batch: list[tuple[int, Outcome]]) -> None:
        async with self._db.connection() as conn:
            rows = await queries.fetch_all_async(conn, "report_outcomes", {
                "ids": [message_id for message_id, _ in batch],
                "outcomes": [str(outcome.kind) for _, outcome in batch],
                "errors": [outcome.error for _, outcome in batch],
                "retry_after": [outcome.retry_after for _, outcome in batch],
                "responses": [_jsonb(outcome.response) for _, outcome in batch],
            })
        delivered, retried, dead = rows[0]["delivered"], rows[0]["retried"], rows[0]["dead_lettered"]
        self.stats.delivered += delivered
        self.stats.failed += retried + dead
        self.stats.dead_lettered += dead
        for message_id, _ in batch:
            endpoint_id = self._failed_endpoint.pop(message_id, None)
            if endpoint_id is not None:
                self._unreported_failures[endpoint_id] -= 1
        async with self._capacity:
            self._capacity.notify_all()
        # A completion may unblock the next message of an ordering key: look again now.
        for event in self._wake.values():
            event.set()

    async def _drain(self) -> None:
        """Wait for in-flight deliveries; release any still running at the deadline."""
        deadline = time.monotonic() + self.settings.drain_timeout
        while self._dispatch_tasks and time.monotonic() < deadline:
            await asyncio.wait(set(self._dispatch_tasks), timeout=deadline - time.monotonic())
        if self._dispatch_tasks:
            stuck = list(self._in_flight)
            for task in list(self._dispatch_tasks):
                task.cancel()
            await asyncio.gather(*self._dispatch_tasks, return_exceptions=True)
            self._in_flight.clear()
            log.warning("drain timeout: releasing unfinished messages", extra={"count": len(stuck)})
            await self._call_with_retry(lambda: self._release(stuck))

    async def _release(self, message_ids: list[int]) -> None:
        async with self._db.connection() as conn:
            await queries.fetch_value_async(conn, "release_batch", {"ids": message_ids, "delay": 0})

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
                            self._wake[int(payload)].set()
                        else:
                            for event in self._wake.values():
                                event.set()
            except CourierError as error:
                log.warning("LISTEN connection lost; reconnecting", extra={"error": error.one_line()})
                await asyncio.sleep(1.0)

    async def _heartbeat(self, state: str | None = None) -> None:
        state = state or ("draining" if self._stopping.is_set() else "running")
        async with self._db.connection() as conn:
            await queries.fetch_value_async(conn, "worker_heartbeat", {
                "worker_id": self.worker_id, "hostname": socket.gethostname(), "pid": os.getpid(),
                "concurrency": self.settings.concurrency, "in_flight": len(self._in_flight),
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
            except CourierError as error:
                log.warning("periodic task failed", extra={"task": action.__name__, "error": error.one_line()})

    async def _call_with_retry(self, action, attempts: int = 5) -> None:
        for attempt in range(attempts):
            try:
                await action()
                return
            except CourierError as error:
                if attempt == attempts - 1:
                    raise
                log.warning("database call failed; retrying", extra={"error": error.one_line()})
                await asyncio.sleep(0.5 * 2**attempt)


def _jsonb(value: object):
    from psycopg.types.json import Jsonb

    return None if value is None else Jsonb(value)
