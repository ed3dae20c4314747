"""Delivery failures as an operator running `courier worker` under systemd or Kubernetes reads
them: WARNING lines, rate-limited per endpoint. The first failure after a quiet spell is logged
at once, with its error; later ones are summed into one line per endpoint per interval, with
the counts by kind (retryable, permanent, disable: as the dispatcher classed each outcome) and
the last error. The JSON log redacts and escapes the error text."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from .outcome import Outcome, OutcomeKind

log = logging.getLogger("courier.worker")

SUMMARY_SECONDS = 30.0
ERROR_CHARACTERS = 500
"""How much of the last error a line quotes."""
NOT_FAILURES = (OutcomeKind.SUCCESS, OutcomeKind.SNOOZE)  # a snooze is the receiver's "later"
FAILURE_KINDS = tuple(kind for kind in OutcomeKind if kind not in NOT_FAILURES)
"""Every line counts each of these, zeros included, so a reader can sum a field across lines."""


@dataclass
class _Failures:
    counts: Counter[OutcomeKind] = field(default_factory=Counter)
    last_error: str | None = None
    logged_at: float = float("-inf")


class FailureLog:
    def __init__(self, interval: float = SUMMARY_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._by_endpoint: dict[str, _Failures] = {}

    def record(self, endpoint: str, outcome: Outcome) -> None:
        if outcome.kind in NOT_FAILURES:
            return
        failures = self._by_endpoint.setdefault(endpoint, _Failures())
        failures.counts[outcome.kind] += 1
        failures.last_error = (outcome.error or outcome.kind.value)[:ERROR_CHARACTERS]
        self._log_if_due(endpoint, failures)

    def flush(self, *, all_of_them: bool = False) -> None:
        """Log the summaries whose interval has passed (at a stop: every one left)."""
        for endpoint, failures in list(self._by_endpoint.items()):
            self._log_if_due(endpoint, failures, now_anyway=all_of_them)

    def _log_if_due(self, endpoint: str, failures: _Failures, now_anyway: bool = False) -> None:
        now = self._clock()
        total = failures.counts.total()
        if not total:
            return
        if not now_anyway and now - failures.logged_at < self._interval:
            return
        quiet = now - failures.logged_at >= 2 * self._interval
        log.warning("delivery failed" if quiet and total == 1 else "delivery failures", extra={
            "endpoint": endpoint, **{kind.value: failures.counts[kind] for kind in FAILURE_KINDS},
            "last_error": failures.last_error,
            **({} if quiet else {"over_seconds": round(now - failures.logged_at, 1)})})
        failures.counts.clear()
        failures.logged_at = now
