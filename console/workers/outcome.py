"""What a dispatcher says happened to one message; SQL decides what follows from it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class OutcomeKind(StrEnum):
    SUCCESS = "success"
    RETRYABLE = "retryable"  # 429, 5xx, timeouts, connection errors: retry with backoff
    PERMANENT = "permanent"  # other 4xx, invalid requests: dead-letter at once
    DISABLE = "disable"  # 410 Gone: dead-letter, and disable the endpoint if so configured


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    error: str | None = None
    retry_after: int | None = None
    response: dict[str, Any] | None = None

    @classmethod
    def success(cls, response: dict[str, Any] | None = None) -> Outcome:
        return cls(OutcomeKind.SUCCESS, response=response)

    @classmethod
    def retryable(cls, error: str, retry_after: int | None = None) -> Outcome:
        return cls(OutcomeKind.RETRYABLE, f"[RETRYABLE] {error}", retry_after)

    @classmethod
    def permanent(cls, error: str) -> Outcome:
        return cls(OutcomeKind.PERMANENT, f"[PERMANENT] {error}")

    @classmethod
    def disable(cls, error: str) -> Outcome:
        return cls(OutcomeKind.DISABLE, f"[DISABLE] {error}")
