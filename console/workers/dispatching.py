"""Deliveries: the dispatchers, each endpoint's in-flight limit and prefetch size, the
deliveries in flight and their outcomes handed to the reporter, and the drain at a stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection

from sqlkit.messages import ClaimedMessage

from ..extras import for_protocol
from .capacity import Capacity
from .dispatchers import Dispatcher, Target, dispatcher_for
from .faults import call_with_retry, one_line
from .leases import Leases
from .outcome import Outcome
from .prefetch import Prefetch
from .reporting import Reporter
from .settings import HTTP_DEFAULT_CONCURRENCY, PoolSettings

log = logging.getLogger("courier.worker")

PREFETCH = 100
"""Most messages an endpoint dispatched one at a time (HTTP) holds claimed beyond its free
slots: enough to cover a claim's round trip at several thousand requests a second."""


class Deliveries:
    """Starts deliveries (a claimed batch at once, or one prefetched message per free slot),
    records each outcome with the reporter, and counts what is in flight, in total and by
    endpoint, for the claims' room."""

    def __init__(self, settings: PoolSettings, capacity: Capacity, leases: Leases, prefetch: Prefetch,
                 reporter: Reporter, current: Callable[[Target], bool], target: Callable[[int], Target | None],
                 db_settings: Callable[[], dict[str, str]]) -> None:
        self._settings = settings
        self._capacity = capacity
        self._leases = leases
        self._prefetch = prefetch
        self._reporter = reporter
        self._current = current  # the endpoint is still served as it is (not stopping, not changed)
        self._target = target  # the endpoint served under an id, if any
        self._db_settings = db_settings  # the database's settings as last read
        self._dispatchers: dict[str, Dispatcher | None] = {}
        self._in_flight: dict[int, ClaimedMessage] = {}
        self._in_flight_by_endpoint: dict[int, int] = defaultdict(int)
        self._dispatch_tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def in_flight_to(self, endpoint_id: int) -> int:
        return self._in_flight_by_endpoint[endpoint_id]

    def in_flight_messages(self) -> list[ClaimedMessage]:
        return list(self._in_flight.values())

    # Dispatchers and limits ------------------------------------------------------------

    def dispatcher(self, protocol: str) -> Dispatcher | None:
        """The protocol's dispatcher, made at first use; None where there is none."""
        if protocol not in self._dispatchers:
            self._dispatchers[protocol] = dispatcher_for(protocol, self._db_settings())
            if self._dispatchers[protocol] is None:
                extra = for_protocol(protocol)
                if extra is not None and not extra.installed():
                    log.warning("this install cannot deliver to %s endpoints: their messages stay queued until "
                                "a worker with the %s extra serves them (%s)", protocol, extra.name, extra.install,
                                extra={"protocol": protocol})
                else:
                    log.warning("no dispatcher for protocol; its messages stay queued", extra={"protocol": protocol})
        return self._dispatchers[protocol]

    async def refresh(self, serving: Collection[int]) -> None:
        """After a re-read of the endpoints and settings: `serving`, the endpoints served now."""
        for dispatcher in self._dispatchers.values():
            # Settings are live: a dispatcher that reads any takes them at every refresh.
            apply_settings = getattr(dispatcher, "apply_settings", None)
            if apply_settings is not None:
                apply_settings(self._db_settings())
            # Broker dispatchers close the idle connections of endpoints no longer served.
            retain = getattr(dispatcher, "retain", None)
            if retain is not None:
                await retain(set(serving))

    def close(self) -> asyncio.Future[list[object]]:
        """Close every dispatcher, together (a stop bounds the wait)."""
        return asyncio.gather(*(dispatcher.close() for dispatcher in self._dispatchers.values()
                                if dispatcher is not None), return_exceptions=True)

    def limit(self, target: Target) -> int:
        """How many of the endpoint's messages this pool may have in flight at once."""
        configured = target.config.get("concurrency")
        if configured is None:
            return self._default_limit(target)
        return self._settings.share.of(int(configured))

    def _default_limit(self, target: Target) -> int:
        """In-flight limit of an endpoint without config.concurrency: the whole pool, except
        that a webhook gets at most HTTP_DEFAULT_CONCURRENCY requests at once, so a default
        pool sized for no-op throughput never opens hundreds of connections to one server."""
        if target.protocol == "http":
            return min(self._settings.concurrency, self._settings.share.of(HTTP_DEFAULT_CONCURRENCY))
        return self._settings.concurrency

    def prefetch_size(self, target: Target, limit: int) -> int:
        """How many claimed messages an endpoint may hold beyond its in-flight limit: none for
        a batched dispatcher (it takes whole claims), else up to PREFETCH, but at most four
        times its limit, so that an endpoint allowed one request at a time holds four more,
        not a hundred."""
        dispatcher = self._dispatchers.get(target.protocol)
        if dispatcher is None or dispatcher.batched or target.config.get("rate_limit"):
            # A rate limit's tokens are taken at the claim: messages claimed ahead while the
            # endpoint was slow would go out together later, past its burst.
            return 0
        return max(0, min(PREFETCH, self._settings.batch_size, 4 * limit))

    # Deliveries ------------------------------------------------------------------------

    def start_batch(self, target: Target, messages: list[ClaimedMessage]) -> None:
        """Hand a whole claim to the endpoint's batched dispatcher."""
        for message in messages:
            self._in_flight[message.id] = message
        self._in_flight_by_endpoint[target.id] += len(messages)
        task = asyncio.create_task(self._dispatch_batch(target, messages))
        self._dispatch_tasks.add(task)
        task.add_done_callback(self._dispatch_tasks.discard)

    def pump(self, target: Target) -> None:
        """Start the endpoint's prefetched messages while it and the pool have room. If the
        endpoint has a failure SQL has not seen yet, or it is stopping or being reconfigured,
        give them back instead: a circuit that failure opens must stop them, and a changed
        endpoint is delivered with its new configuration."""
        if not self._prefetch.holds(target.id):
            return
        if self._reporter.has_unreported_failure(target.id) or not self._current(target):
            self._prefetch.release(target.id)
            return
        limit = self.limit(target)
        while (self._prefetch.holds(target.id) and self._in_flight_by_endpoint[target.id] < limit
               and len(self._in_flight) < self._settings.concurrency):
            self._start(target, self._prefetch.take(target.id))

    def _start(self, target: Target, message: ClaimedMessage) -> None:
        self._in_flight[message.id] = message
        self._in_flight_by_endpoint[target.id] += 1
        task = asyncio.create_task(self._dispatch(target, message))
        self._dispatch_tasks.add(task)
        task.add_done_callback(self._dispatch_tasks.discard)

    async def _dispatch(self, target: Target, message: ClaimedMessage) -> None:
        dispatcher = self.dispatcher(target.protocol)
        assert dispatcher is not None
        try:
            outcome = await dispatcher.deliver(target, message)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            _log_dispatcher_error(target, error, message_id=message.id)
            outcome = _local_error(error)
        self._record(target, [message], [outcome])
        self._pump_freed(target)
        await self._capacity.notify()

    async def _dispatch_batch(self, target: Target, messages: list[ClaimedMessage]) -> None:
        """One claimed batch through deliver_batch: the dispatcher publishes it in one go and
        returns one outcome per message; each is then recorded exactly as _dispatch does."""
        dispatcher = self.dispatcher(target.protocol)
        assert dispatcher is not None
        try:
            outcomes = await dispatcher.deliver_batch(target, messages)
            if len(outcomes) != len(messages):
                raise RuntimeError(f"deliver_batch returned {len(outcomes)} outcomes for {len(messages)} messages")
        except asyncio.CancelledError:
            raise
        except Exception as error:
            _log_dispatcher_error(target, error, messages=len(messages))
            outcomes = [_local_error(error)] * len(messages)
        self._record(target, messages, outcomes)
        self._pump_freed(target)
        await self._capacity.notify()

    def _record(self, target: Target, messages: list[ClaimedMessage], outcomes: list[Outcome]) -> None:
        self._reporter.record(target, list(zip(messages, outcomes, strict=True)))
        in_flight = self._in_flight
        for message in messages:
            in_flight.pop(message.id, None)
        self._in_flight_by_endpoint[target.id] -= len(messages)

    def _pump_freed(self, target: Target) -> None:
        """After a delivery freed slots: start prefetched messages of its endpoint, then of any
        other, since the pool's limit, not their own, may be what held them back."""
        self.pump(target)
        if len(self._in_flight) < self._settings.concurrency:
            for endpoint_id in [e for e in self._prefetch.holding() if e != target.id]:
                other = self._target(endpoint_id)
                if other is not None:
                    self.pump(other)

    async def drain(self, deadline: float) -> None:
        """Wait for in-flight deliveries; release any still running at the deadline."""
        while self._dispatch_tasks and time.monotonic() < deadline:
            await asyncio.wait(set(self._dispatch_tasks), timeout=deadline - time.monotonic())
        if self._dispatch_tasks:
            stuck = list(self._in_flight.values())
            for task in list(self._dispatch_tasks):
                task.cancel()
            await asyncio.gather(*self._dispatch_tasks, return_exceptions=True)
            self._in_flight.clear()
            log.warning("drain timeout: releasing unfinished messages", extra={"count": len(stuck)})
            try:
                await call_with_retry(lambda: self._leases.release(stuck), attempts=3)
            except Exception as error:  # their leases run out and stale recovery takes them back
                log.error("releasing unfinished messages failed", extra={"error": one_line(error)})


TRACEBACK_EVERY = 600.0
"""Seconds between two tracebacks of the same dispatcher error on the same endpoint."""
_traceback_logged: dict[tuple[int, str, str], float] = {}


def _log_dispatcher_error(target: Target, error: BaseException, **details: object) -> None:
    """The traceback of a dispatcher that raised, once per endpoint and error every
    TRACEBACK_EVERY seconds: an endpoint whose every message raises the same error (a config
    the client refuses) logged a traceback per message. The failures themselves are counted
    and summarised per endpoint by the failure log."""
    signature = (target.id, type(error).__name__, str(error)[:200])
    now = time.monotonic()
    if now - _traceback_logged.get(signature, -TRACEBACK_EVERY) < TRACEBACK_EVERY:
        return
    if len(_traceback_logged) > 1000:
        _traceback_logged.clear()
    _traceback_logged[signature] = now
    log.exception("dispatcher raised (its traceback is logged once every %d s per endpoint and error)",
                  TRACEBACK_EVERY, extra={"endpoint": target.name, **details})


def _local_error(error: BaseException) -> Outcome:
    """The outcome of a dispatcher that raised. A local failure (a bug, or data the dispatcher
    cannot send, such as a header with a line break) says nothing about the endpoint, so it
    is PERMANENT, which never counts towards its circuit (SQL counts RETRYABLE ones): the
    message goes to the DLQ with the error, for a redrive once fixed."""
    return Outcome.permanent(f"local dispatcher error, not the endpoint's: "
                             f"{type(error).__name__}: {str(error)[:300]}")
