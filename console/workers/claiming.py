"""Claims: each endpoint's claim loops, the room a claim may take, and report_and_claim,
which carries the outcomes held so far in the claim's round trip; and the loops' wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable

from sqlkit import queries
from sqlkit.connection import AsyncDatabase
from sqlkit.linger import Linger
from sqlkit.messages import CLAIM_COLUMNS, ClaimedMessage, claimed_from_values

from .awake import WakeHold
from .capacity import Capacity
from .dispatchers import Target
from .dispatching import Deliveries
from .faults import one_line
from .leases import Leases
from .outcome import Outcome
from .prefetch import Prefetch
from .reporting import Reporter, report_params
from .settings import PoolSettings, PoolStats

log = logging.getLogger("courier.worker")


class Wakeups:
    """What the claim loops of an endpoint wait for besides room: a wake-up (a NOTIFY, a report
    that concerns the endpoint, a change of it, a stop), and, for its extra claimers, claims
    coming back full."""

    def __init__(self) -> None:
        self._wake: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        # Set while an endpoint's claims come back full: its extra claimers work only then.
        self._busy: dict[int, asyncio.Event] = defaultdict(asyncio.Event)

    def wake(self, endpoint_id: int) -> None:
        """The endpoint's claim loop claims at once rather than at its next poll."""
        self._wake[endpoint_id].set()

    def wake_all(self) -> None:
        for event in self._wake.values():
            event.set()

    def rouse(self, endpoint_id: int) -> None:
        """Every claimer of the endpoint looks at once, idle ones too (to end, if it changed)."""
        self._wake[endpoint_id].set()
        self._busy[endpoint_id].set()

    def rouse_all(self) -> None:
        for event in [*self._wake.values(), *self._busy.values()]:
            event.set()

    def any_busy(self) -> bool:
        """Whether some endpoint's claims come back full."""
        return any(busy.is_set() for busy in self._busy.values())

    def wake_event(self, endpoint_id: int) -> asyncio.Event:
        return self._wake[endpoint_id]

    def busy_event(self, endpoint_id: int) -> asyncio.Event:
        return self._busy[endpoint_id]


class Claims:
    """The claim loops, one set per endpoint served: each waits for room, claims (carrying
    the reporter's outcomes), and hands what it claimed to the deliveries, as a batch or
    through the prefetch."""

    def __init__(self, db: AsyncDatabase, settings: PoolSettings, stats: PoolStats, capacity: Capacity,
                 leases: Leases, wakeups: Wakeups, prefetch: Prefetch, deliveries: Deliveries, reporter: Reporter,
                 stopping: asyncio.Event, current: Callable[[Target], bool]) -> None:
        self._db = db
        self._settings = settings
        self._stats = stats
        self._capacity = capacity
        self._leases = leases
        self._wakeups = wakeups
        self._prefetch = prefetch
        self._deliveries = deliveries
        self._reporter = reporter
        self._stopping = stopping
        self._current = current  # the endpoint is still served as it is (not stopping, not changed)
        self._loops: dict[int, asyncio.Task[None]] = {}
        # Slots reserved by claims on their way to the database, in total and by endpoint.
        self._claiming = 0
        self._claiming_by_endpoint: dict[int, int] = defaultdict(int)
        # Set (and cleared at once) whenever a claim of the endpoint commits, and so gives back
        # its claim slot: this pool's claimers waiting for a slot try again at once.
        self._claim_ended: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self._wake_hold = WakeHold(db, stats)

    def serve(self, target: Target) -> None:
        """Start the endpoint's claim loops, unless they run already or no dispatcher serves
        its protocol. They end once the endpoint is no longer current (see Wakeups.rouse)."""
        running = self._loops.get(target.id)
        if (running is None or running.done()) and self._deliveries.dispatcher(target.protocol) is not None:
            self._loops[target.id] = asyncio.create_task(self._endpoint_loop(target), name=f"claim-{target.name}")

    async def finish(self) -> None:
        """Wait for every claim loop to end (a stop: their claims in progress complete)."""
        await asyncio.gather(*self._loops.values(), return_exceptions=True)
        await self._wake_hold.close()

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
        busy = self._wakeups.busy_event(target.id)
        busy.clear()
        dispatcher = self._deliveries.dispatcher(target.protocol)
        batched = dispatcher is not None and dispatcher.batched
        claimers = self._settings.claimers if batched else 1
        try:
            await asyncio.gather(*(self._claim_loop(target, busy, eager=n > 0, holds_wake=batched and n == 0)
                                   for n in range(max(1, claimers))))
        finally:
            await self._wake_hold.release(target.id)

    async def _claim_loop(self, target: Target, busy: asyncio.Event, eager: bool, holds_wake: bool = False) -> None:
        """With `holds_wake`, the loop holds the endpoint's wake lock while it claims back to
        back (see console/workers/awake.py): after its second claim in a row that found
        messages, until one finds none."""
        wake = self._wakeups.wake_event(target.id)
        failures = 0
        linger = Linger(self._settings.linger, self._settings.linger_limit)
        busy_for = _SlotWait()
        found_before = False  # the last claim found messages
        while self._current(target):
            if eager and not busy.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(busy.wait(), self._settings.poll_interval)
                continue
            room = await self._room(target)
            if not self._current(target):
                self._unreserve(target.id, room)
                return
            if wake.is_set():
                linger.start()
            wake.clear()
            unslotted = busy_for.exhausted
            if unslotted:
                log.warning("claim slots taken for a while; claiming without one",
                            extra={"endpoint": target.name})
            try:
                # A claim after a full one asks nothing: it rarely comes back empty, and each
                # question takes the producers' lock exclusively for an instant, in which a
                # producer committing fails to take its shared one (sends_committing).
                holding = self._wake_hold.holds(target.id)
                claimed, slotless, committing = await self._claim(
                    target.id, room, unslotted=unslotted,
                    linger=(linger.asks_with_claim() or holding) and not busy.is_set())
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
            if not slotless:
                ended = self._claim_ended[target.id]
                ended.set()
                ended.clear()
            if len(claimed) >= room:
                busy.set()
            else:
                busy.clear()
            if slotless:
                # Other claims of this endpoint hold all its slots (more claimers than slots):
                # they commit within milliseconds, this pool's own waking it at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._claim_ended[target.id].wait(), busy_for.next_pause())
                continue
            busy_for.reset()
            if not claimed:
                found_before = False
                if holding and committing:
                    # Producers are committing: still awake, it looks again after the linger's
                    # pause, still holding. No NOTIFY comes to cut a pause short while it holds,
                    # so none is longer than HELD_PAUSE (longer ones cost p99 latency 3 ms at
                    # 2,000 sends a second).
                    if not linger.active:
                        linger.start()
                    pause = linger.after_asked(True)
                    if pause is not None:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(wake.wait(), min(pause, HELD_PAUSE))
                        continue
                if await self._wake_hold.release(target.id):
                    # Producers skipped their NOTIFY while it was held: one more look, asking.
                    wake.set()
                    continue
                if committing is not None:  # the claim asked: no look after it, unless one is
                    pause = linger.after_asked(committing)
                else:
                    pause = await self._linger_pause(target, linger)
                if pause is None:
                    pause = self._settings.poll_interval
                if pause:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), pause)
                continue
            dispatcher = self._deliveries.dispatcher(target.protocol)
            if dispatcher is None:  # cannot happen: loops start only for protocols with one
                continue
            if holds_wake and found_before:
                await self._wake_hold.hold(target.id)
            if holding:
                linger.start()  # a linger while it holds counts from the last claim that found messages
            found_before = True
            if dispatcher.batched:
                self._deliveries.start_batch(target, claimed)
                # One turn of the event loop before the next claim: a dispatcher that is
                # done at once (noop) records its outcomes in it, and that claim carries them,
                # instead of the reporter sending them in a round trip of their own.
                await asyncio.sleep(0)
            else:
                self._prefetch.add(target.id, claimed)
                self._deliveries.pump(target)

    async def _linger_pause(self, target: Target, linger: Linger) -> float | None:
        """After an empty claim: the pause before the linger's next claim, or None if the
        loop is not lingering (any more) and waits for a wake-up or the poll."""
        if not linger.asks():
            return None
        try:
            self._stats.round_trips += 1
            async with self._db.connection() as conn:
                committing = await queries.fetch_value_async(conn, "sends_committing", {"endpoint_id": target.id})
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the poll still finds whatever the linger would have
            log.info("linger check failed", extra={"endpoint": target.name, "error": one_line(error)})
            linger.stop()
            return None
        return linger.next_pause(bool(committing))

    async def _room(self, target: Target) -> int:
        """Wait until this endpoint may take at least one more message; return how many
        (0 when the pool is stopping). An endpoint with failures not yet reported gets no
        room, so that a circuit they open stops its next claim, not the one after.

        An endpoint dispatched one message at a time may also hold a prefetch of claimed
        messages beyond its in-flight limit (see Prefetch); it claims again when half of
        that prefetch is gone, so a busy webhook pays one round trip per half batch."""
        settings = self._settings
        async with self._capacity:
            while not self._stopping.is_set():
                # Read on every wake-up: resize() changes the pool's concurrency, which is
                # also the default limit of an endpoint without its own config.concurrency.
                limit = self._deliveries.limit(target)
                prefetch = self._deliveries.prefetch_size(target, limit)
                # Slots reserved by claims on their way count as taken.
                held = (self._deliveries.in_flight_to(target.id) + self._claiming_by_endpoint[target.id]
                        + self._prefetch.held(target.id))
                room = min(settings.batch_size,
                           settings.concurrency + prefetch - self._deliveries.in_flight_count - self._claiming
                           - self._prefetch.total(),
                           limit + prefetch - held)
                if prefetch:
                    enough = 1 if held == 0 else max(1, prefetch // 2)
                else:
                    # A claim for one freed slot costs a round trip per message: while the
                    # endpoint is busy, wait until a quarter of its budget (or a batch) is free.
                    enough = 1 if held == 0 else max(1, min(settings.batch_size, limit // 4,
                                                            settings.concurrency // 4))
                if (room >= enough and not self._reporter.has_unreported_failure(target.id)
                        and self._reporter.unreported() < settings.max_unreported):
                    self._claiming += room
                    self._claiming_by_endpoint[target.id] += room
                    return room
                await self._capacity.wait()
            return 0

    def _unreserve(self, endpoint_id: int, room: int) -> None:
        """Give back the slots _room reserved for a claim, now that its messages (if any)
        count as in flight; the part it did not fill is free for others again."""
        self._claiming -= room
        self._claiming_by_endpoint[endpoint_id] -= room
        if room:
            self._capacity.notify_soon()

    async def _claim(self, endpoint_id: int, room: int, unslotted: bool = False,
                     linger: bool = False) -> tuple[list[ClaimedMessage], bool, bool | None]:
        """Claim for one endpoint, reporting the outcomes held so far in the same round trip
        (and the same commit). If that fails, the outcomes go back to the reporter, which
        retries them or isolates a bad one, and the claim goes alone. Also says whether the
        claim found the endpoint's claim slots all taken (and so claimed nothing); `unslotted`
        claims without one (claim_batch), once slots stayed taken for SLOT_WAIT_LIMIT. With
        `linger`, the claim first asks whether producers are committing, and the answer comes
        third; it is None when the claim did not ask."""
        params = {"worker_id": self._settings.worker_id, "batch_size": room, "endpoint_id": endpoint_id}
        if unslotted:
            self._stats.round_trips += 1
            async with self._db.connection() as conn:
                return self._decoded(await queries.fetch_tuples_async(conn, "claim_for_endpoint", params)), False, None
        batch = self._reporter.take()
        try:
            self._stats.round_trips += 1
            async with self._db.connection() as conn:
                rows = await queries.fetch_tuples_async(conn, "report_and_claim",
                                                        {**params, **report_params(batch), "linger": linger})
        except BaseException as error:
            self._reporter.give_back(batch, error)
            if not batch or not isinstance(error, Exception):
                raise
            # The outcomes may be what failed (refused, or waiting on a lock): the reporter
            # retries or isolates them, and a claim does not wait for it. If the database
            # is away, this claim fails too.
            log.info("report with claim failed; reporting separately", extra={"error": one_line(error)})
            self._reporter.wake()
            self._stats.round_trips += 1
            async with self._db.connection() as conn:
                return self._decoded(await queries.fetch_tuples_async(conn, "claim_for_endpoint", params)), False, None
        # After the claim's columns, every row carries the report's counts and the claim's flags.
        delivered, retried, dead_lettered, stale, busy, committing = (
            rows[0][CLAIM_COLUMNS:] if rows else (0, 0, 0, 0, False, None))
        slotless = bool(busy)
        # A claim that found a slot looked after the report, in its transaction: what the report
        # unblocked for this endpoint (an ordering key's next message) it has seen already.
        await self._reporter.reported(batch, {"delivered": delivered, "retried": retried,
                                              "dead_lettered": dead_lettered, "stale": stale},
                                      looked=None if slotless else endpoint_id)
        return self._decoded(rows), slotless, committing

    def _decoded(self, rows: list[tuple]) -> list[ClaimedMessage]:
        """The claimed messages of a claim's rows, their leases recorded."""
        # report-and-claim's row of counts, when nothing was claimed, has no id
        rows = [row for row in rows if row[0] is not None]
        self._leases.taken((row[0] for row in rows), time.monotonic())
        claimed = []
        for row in rows:
            try:
                claimed.append(claimed_from_values(row))
            except Exception as error:  # RecursionError, bad JSON: this message fails alone
                log.error("claimed message cannot be decoded",
                          extra={"message_id": row[0], "error": one_line(error)})
                undecodable = claimed_from_values((*row[:5], "{}", "{}", *row[7:CLAIM_COLUMNS]))
                self._reporter.add(undecodable, Outcome.permanent(
                    f"the worker cannot decode this message's headers or metadata: {one_line(error)[:200]}"))
        return claimed


HELD_PAUSE = 0.001
"""Longest pause between the claims of a loop that holds its endpoint's wake lock, while
producers are committing (console/workers/awake.py)."""

SLOT_PAUSES = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
"""Most seconds between claims while an endpoint's claim slots are all taken, growing while
they stay taken (the last repeats). A claim of a full batch commits within milliseconds."""
SLOT_WAIT_LIMIT = 1.0
"""Seconds a claim loop waits for a free claim slot before it claims once without one: slots
taken for longer (a claim stuck behind a lock, a session squatting on them) are claimed past."""


class _SlotWait:
    """How long a claim loop has waited for a free claim slot, and how long to wait next."""

    def __init__(self) -> None:
        self._step = 0
        self._since: float | None = None

    @property
    def exhausted(self) -> bool:
        """Slots stayed taken for SLOT_WAIT_LIMIT: the next claim goes without one."""
        return self._since is not None and time.monotonic() - self._since >= SLOT_WAIT_LIMIT

    def next_pause(self) -> float:
        if self._since is None:
            self._since = time.monotonic()
        pause = SLOT_PAUSES[min(self._step, len(SLOT_PAUSES) - 1)]
        self._step += 1
        return pause

    def reset(self) -> None:
        self._step = 0
        self._since = None
