"""What a dispatcher says happened to one message; SQL decides what follows from it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlkit.redaction import redact_text


class OutcomeKind(StrEnum):
    SUCCESS = "success"
    RETRYABLE = "retryable"  # 429, 5xx, timeouts, connection errors: retry with backoff
    PERMANENT = "permanent"  # other 4xx, invalid requests: dead-letter at once
    DISABLE = "disable"  # 410 Gone: dead-letter, and disable the endpoint if so configured
    SNOOZE = "snooze"  # a status the endpoint names, with Retry-After: again later, no attempt counted


@dataclass(frozen=True)
class Outcome:
    """Errors are redacted as they are made: a broker client's exception text often quotes the
    URL it connected with, and errors end up in logs, the DLQ and the event log."""

    kind: OutcomeKind
    error: str | None = None
    retry_after: int | None = None
    response: dict[str, Any] | None = None

    @classmethod
    def success(cls, response: dict[str, Any] | None = None) -> Outcome:
        return cls(OutcomeKind.SUCCESS, response=response)

    @classmethod
    def retryable(cls, error: str, retry_after: int | None = None) -> Outcome:
        return cls(OutcomeKind.RETRYABLE, f"[RETRYABLE] {redact_text(error)}", retry_after)

    @classmethod
    def snooze(cls, status: int, seconds: int) -> Outcome:
        return cls(OutcomeKind.SNOOZE, f"[SNOOZE] HTTP {status}, Retry-After {seconds}", seconds)

    @classmethod
    def permanent(cls, error: str) -> Outcome:
        return cls(OutcomeKind.PERMANENT, f"[PERMANENT] {redact_text(error)}")

    @classmethod
    def disable(cls, error: str) -> Outcome:
        return cls(OutcomeKind.DISABLE, f"[DISABLE] {redact_text(error)}")
