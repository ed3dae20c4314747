"""Delivery failures as an operator running `courier worker` under systemd or Kubernetes reads
them: WARNING lines, rate-limited per endpoint. The first failure after a quiet spell is logged
at once, with its error; later ones are summed into one line per endpoint per interval, with
the counts by kind and the last error. The JSON log redacts and escapes the error text."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from .outcome import Outcome, OutcomeKind

log = logging.getLogger("courier.worker")

SUMMARY_SECONDS = 30.0
ERROR_CHARACTERS = 500
"""How much of the last error a line quotes."""


@dataclass
class _Failures:
    retryable: int = 0
    permanent: int = 0
    last_error: str | None = None
    logged_at: float = float("-inf")


class FailureLog:
    def __init__(self, interval: float = SUMMARY_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._by_endpoint: dict[str, _Failures] = {}

    def record(self, endpoint: str, outcome: Outcome) -> None:
        if outcome.kind in (OutcomeKind.SUCCESS, OutcomeKind.SNOOZE):  # a snooze is the receiver's "later"
            return
        failures = self._by_endpoint.setdefault(endpoint, _Failures())
        if outcome.kind == OutcomeKind.PERMANENT:
            failures.permanent += 1
        else:
            failures.retryable += 1
        failures.last_error = (outcome.error or outcome.kind.value)[:ERROR_CHARACTERS]
        self._log_if_due(endpoint, failures)

    def flush(self, *, all_of_them: bool = False) -> None:
        """Log the summaries whose interval has passed (at a stop: every one left)."""
        for endpoint, failures in list(self._by_endpoint.items()):
            self._log_if_due(endpoint, failures, now_anyway=all_of_them)

    def _log_if_due(self, endpoint: str, failures: _Failures, now_anyway: bool = False) -> None:
        now = self._clock()
        if not (failures.retryable or failures.permanent):
            return
        if not now_anyway and now - failures.logged_at < self._interval:
            return
        quiet = now - failures.logged_at >= 2 * self._interval
        log.warning("delivery failed" if quiet and failures.retryable + failures.permanent == 1
                    else "delivery failures", extra={
                        "endpoint": endpoint, "retryable": failures.retryable, "permanent": failures.permanent,
                        "last_error": failures.last_error,
                        **({} if quiet else {"over_seconds": round(now - failures.logged_at, 1)})})
        failures.retryable = failures.permanent = 0
        failures.logged_at = now
