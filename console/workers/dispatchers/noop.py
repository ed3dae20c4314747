"""The noop protocol: every delivery succeeds at once. For benchmarks and dry runs."""

from __future__ import annotations

from sqlkit.messages import ClaimedMessage

from ..outcome import Outcome
from . import Target


class NoopDispatcher:
    async def deliver(self, target: Target, message: ClaimedMessage) -> Outcome:
        return Outcome.success()

    async def close(self) -> None:
        return None
