"""Outcomes on their way to SQL: held until a claim carries them or the reporter sends them,
retried while the database is away, and a bad one isolated so it fails its message alone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from psycopg.types.json import Jsonb

from sqlkit import queries
from sqlkit.connection import AsyncDatabase
from sqlkit.errors import CourierError, DatabaseUnavailable
from sqlkit.messages import ClaimedMessage

from .capacity import Capacity
from .dispatchers import Target
from .failure_log import FailureLog
from .faults import one_line
from .leases import Leases
from .outcome import Outcome, OutcomeKind
from .settings import PoolSettings, PoolStats

log = logging.getLogger("courier.worker")

REPORT_BATCH = 500
"""Most outcomes one report (or one report-and-claim) carries."""

Report = tuple[ClaimedMessage, Outcome]


class Reporter:
    """Holds outcomes until they are reported: a claim takes them to carry in its round trip
    (take(), then reported() or give_back()); the report loop (run()) sends what no claim
    took. While outcomes wait, the claims read unreported() and has_unreported_failure()."""

    def __init__(self, db: AsyncDatabase, settings: PoolSettings, stats: PoolStats, capacity: Capacity,
                 leases: Leases, stopping: asyncio.Event, wake: Callable[[int], None],
                 busy: Callable[[], bool]) -> None:
        self._db = db
        self._settings = settings
        self._stats = stats
        self._capacity = capacity
        self._leases = leases
        self._stopping = stopping
        self._wake_endpoint = wake  # an endpoint's claim loop looks again at once
        self._busy = busy  # whether some endpoint's claims come back full
        self._reports: list[Report] = []
        # Outcomes taken from _reports by a report (or a report-and-claim) in progress; put
        # back in front if it fails.
        self._reports_sending = 0
        # Messages whose outcome went out in a report that failed in transit, and is sent again.
        self._unanswered: set[int] = set()
        # Failures not yet reported, by endpoint: until SQL has seen them it cannot open the
        # circuit, so the endpoint gets no more room until they are (see Claims._room).
        self._unreported_failures: dict[int, int] = defaultdict(int)
        self._failed_endpoint: dict[int, int] = {}
        self._report_wake = asyncio.Event()
        self.failures = FailureLog()

    def unreported(self) -> int:
        """Outcomes held, waiting or in a report on its way (max_unreported bounds it)."""
        return len(self._reports) + self._reports_sending

    def has_unreported_failure(self, endpoint_id: int) -> bool:
        return self._unreported_failures[endpoint_id] != 0

    def waiting(self) -> list[ClaimedMessage]:
        """The messages whose outcomes wait to be reported (not those in a report on its way)."""
        return [message for message, _ in list(self._reports)]

    def record(self, target: Target, reports: list[Report]) -> None:
        """Deliveries' outcomes, to report; a failure holds back its endpoint's claims until
        SQL has seen it."""
        for message, outcome in reports:
            if outcome.kind != OutcomeKind.SUCCESS:
                self._unreported_failures[target.id] += 1
                self._failed_endpoint[message.id] = target.id
                self.failures.record(target.name, outcome)
        self._reports.extend(reports)
        self._report_wake.set()

    def add(self, message: ClaimedMessage, outcome: Outcome) -> None:
        """An outcome to report that holds back no claim (one of a message the worker cannot
        decode, decided at its claim)."""
        self._reports.append((message, outcome))
        self._report_wake.set()

    def wake(self) -> None:
        """Have the report loop look at once."""
        self._report_wake.set()

    def take(self) -> list[Report]:
        """Up to REPORT_BATCH outcomes for a report on its way: hand them back with
        reported() or give_back()."""
        batch = self._reports[:REPORT_BATCH]
        del self._reports[: len(batch)]
        self._reports_sending += len(batch)
        return batch

    def give_back(self, batch: list[Report], error: BaseException | None = None) -> None:
        """Put outcomes back in front after a report that failed with `error`: one that failed
        in transit may have committed before its answer was lost (see _count_reported)."""
        self._reports_sending -= len(batch)
        self._reports[:0] = batch
        if error is not None and _transient(error):
            self._unanswered.update(message.id for message, _ in batch)

    async def reported(self, batch: list[Report], counts: dict[str, Any], looked: int | None = None) -> None:
        """The outcomes of `batch` went with a claim (report_and_claim), which committed:
        `counts`, from its answer, are what they did (delivered, retried, dead_lettered, stale).
        `looked`: the endpoint whose claim ran after them in that transaction, and so already saw
        what they unblocked."""
        self._reports_sending -= len(batch)
        if batch:
            self._count_reported(counts, batch)
            await self._forget(batch, looked)

    async def run(self, drained: Callable[[], bool]) -> None:
        """The report loop: send the outcomes no claim carried, until the pool stops and
        drained() says no outcome can come any more (the claim loops have ended and the
        deliveries are done). Not sooner: a claim still in the database when the stop came
        hands its messages to the deliveries after the last delivery ended."""
        failures = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._report_wake.wait(), 1.0)
            self._report_wake.clear()
            self.failures.flush()
            if not self._stopping.is_set() and self._busy():
                # A busy endpoint claims again within moments, and its claim carries these
                # outcomes in the same round trip; a quiet pool reports them at once.
                await asyncio.sleep(self._settings.report_interval)
            while self._reports:
                batch = self.take()
                settled: set[int] = set()
                try:
                    await self._report_isolating(batch, settled)
                    failures = 0
                except asyncio.CancelledError:
                    self.give_back(self._unsettled(batch, settled))
                    raise
                except Exception as error:  # the database is away: keep the batch, try again
                    self.give_back(self._unsettled(batch, settled), error)
                    failures += 1
                    log.warning("reporting outcomes failed; will retry",
                                extra={"pending_reports": self.unreported(), "error": one_line(error)})
                    await asyncio.sleep(min(0.2 * 2**failures, 5.0))
                    continue
                self._reports_sending -= len(batch)
            if self._stopping.is_set() and drained():
                self.failures.flush(all_of_them=True)
                return

    def _unsettled(self, batch: list[Report], settled: set[int]) -> list[Report]:
        """The part of a batch a failed report has not settled, to be sent again; the rest no
        longer counts as being sent."""
        rest = [item for item in batch if item[0].id not in settled]
        self._reports_sending -= len(batch) - len(rest)
        return rest

    async def _report_isolating(self, batch: list[Report], settled: set[int]) -> None:
        """Report a batch; if the database refuses it for what it holds (not for being away),
        split it until the one bad outcome is found, and record that one as an error of its
        message alone, so one bad response never holds back the others. The ids of messages
        done with (reported, or given up on) go into `settled`: if the database goes away
        halfway, only the rest is sent again."""
        try:
            await self._report(batch)
            settled.update(message.id for message, _ in batch)
            return
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if _transient(error):
                raise
            if len(batch) > 1:
                middle = len(batch) // 2
                await self._report_isolating(batch[:middle], settled)
                await self._report_isolating(batch[middle:], settled)
                return
            message, outcome = batch[0]
            reason = one_line(error)
            log.error("outcome could not be recorded; recording an error for this message instead",
                      extra={"message_id": message.id, "endpoint": message.endpoint_name, "error": reason})
        # Even a delivered message: recording it as failed costs a redelivery, while leaving
        # the batch refused would hold back every outcome behind it.
        replacement = Outcome.retryable(f"the worker could not record this delivery's outcome ({outcome.kind}): "
                                        f"{reason[:300]}")
        try:
            await self._report([(message, replacement)])
        except asyncio.CancelledError:
            raise
        except Exception as second:
            if _transient(second):
                raise
            log.error("outcome dropped; stale recovery will redeliver the message",
                      extra={"message_id": message.id, "error": one_line(second)})
            await self._forget(batch)
        settled.add(message.id)

    async def _report(self, batch: list[Report]) -> None:
        self._stats.round_trips += 1
        self._stats.lone_reports += 1
        async with self._db.connection() as conn:
            rows = await queries.fetch_all_async(conn, "report_outcomes", report_params(batch))
        self._count_reported(rows[0], batch)
        await self._forget(batch)

    def _count_reported(self, counts: dict[str, Any], batch: list[Report]) -> None:
        delivered, retried, dead = counts["delivered"], counts["retried"], counts["dead_lettered"]
        # SQL counts a snooze among the retried; it is the receiver's "later", not a failure.
        snoozed = sum(1 for _, outcome in batch if outcome.kind == OutcomeKind.SNOOZE)
        self._stats.delivered += delivered
        self._stats.failed += max(0, retried - snoozed) + dead
        self._stats.dead_lettered += dead
        stale = counts["stale"]
        if not stale:
            return
        self._stats.stale_reports += stale
        again = sum(1 for message, _ in batch if message.id in self._unanswered)
        if again:
            # A report whose commit answer was lost (the database restarted, the connection
            # broke) is sent again; if the first attempt had committed, this one finds the
            # claims already settled and changes nothing.
            log.warning("outcomes not applied again: an earlier attempt of this report, whose answer was lost, "
                        "may already have recorded them; if it did not, their claims were recovered and the "
                        "messages are delivered again", extra={"count": stale, "sent_again": again})
        else:
            log.warning("outcomes ignored: their claims were recovered (held past the stale-recovery timeout, or "
                        "this worker's database sessions were seen to end) and the messages are delivered again",
                        extra={"count": stale})

    async def _forget(self, batch: list[Report], looked: int | None = None) -> None:
        self._leases.forget(message.id for message, _ in batch)
        reported: set[int] = set()
        for message, _ in batch:
            self._unanswered.discard(message.id)
            endpoint_id = self._failed_endpoint.pop(message.id, None)
            if endpoint_id is not None:
                self._unreported_failures[endpoint_id] -= 1
            reported.add(message.endpoint_id)
        await self._capacity.notify()
        # A report may unblock the next message of an ordering key, or close a circuit: the
        # endpoints it concerns look again now. No other loop is woken: with 20 endpoints,
        # waking every loop on every report cost two round trips per message in empty claims.
        # Nor the endpoint whose claim came after the report in its transaction: at a trickle,
        # that wake-up cost each message one more empty claim.
        reported.discard(looked)
        for endpoint_id in reported:
            self._wake_endpoint(endpoint_id)


def report_params(batch: list[Report]) -> dict[str, list[Any] | None]:
    """The outcomes of a batch as report_outcomes and report_and_claim take them. Retry-afters and
    responses, most often none at all, go as NULL then, which both read as one NULL per id: an
    array of 500 NULLs each was dumped in Python, in every claim of a drain."""
    retry_after = [outcome.retry_after for _, outcome in batch]
    responses = [_jsonb(outcome.response) for _, outcome in batch]
    return {
        "ids": [message.id for message, _ in batch],
        "leases": [message.lease for message, _ in batch],
        "outcomes": [str(outcome.kind) for _, outcome in batch],
        "errors": [outcome.error for _, outcome in batch],
        "retry_after": retry_after if any(value is not None for value in retry_after) else None,
        "responses": responses if any(value is not None for value in responses) else None,
    }


def _jsonb(value: object) -> Jsonb | None:
    return None if value is None else Jsonb(_without_nul(value))


def _without_nul(value: object) -> object:
    """jsonb cannot hold U+0000; a captured body or header with one is recorded without it."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


def _transient(error: BaseException) -> bool:
    """Whether a failed call may succeed as it is later (the database is away, busy or
    restarting), as opposed to being refused for what it carried."""
    if isinstance(error, DatabaseUnavailable | TimeoutError | ConnectionError | OSError):
        return True
    if isinstance(error, CourierError):
        return error.sqlstate is None or error.sqlstate[:2] in ("08", "40", "53", "55", "57", "58")
    return False
