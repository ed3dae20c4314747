"""The noop protocol: every delivery succeeds at once. For benchmarks and dry runs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlkit.messages import ClaimedMessage

from ..outcome import Outcome
from . import BaseDispatcher, Target

_SUCCESS = Outcome.success()


class NoopDispatcher(BaseDispatcher):
    batched = True

    async def deliver(self, target: Target, message: ClaimedMessage) -> Outcome:
        return _SUCCESS

    async def deliver_batch(self, target: Target, messages: Sequence[ClaimedMessage]) -> list[Outcome]:
        return [_SUCCESS] * len(messages)
