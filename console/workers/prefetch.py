"""The prefetch: messages claimed ahead of free slots for endpoints dispatched one at a time
(HTTP), held in claim order until a slot frees, or given back to the queue."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import Callable, Iterable

from sqlkit.messages import ClaimedMessage

from .capacity import Capacity
from .faults import call_with_retry, one_line
from .leases import Leases

log = logging.getLogger("courier.worker")


class Prefetch:
    """Claimed ahead for endpoints dispatched one message at a time (HTTP): a freed slot
    takes its next message from here at once instead of waiting for a claim's round
    trip, and claims come in batches instead of a few freed slots at a time. Claims fill it
    (and count it in their room); deliveries take from it, first in first out."""

    def __init__(self, leases: Leases, capacity: Capacity, wake: Callable[[int], None]) -> None:
        self._leases = leases
        self._capacity = capacity
        self._wake = wake  # an endpoint's claim loop looks again at once
        self._buffered: dict[int, deque[ClaimedMessage]] = defaultdict(deque)
        self._releasing: set[asyncio.Task[None]] = set()

    def add(self, endpoint_id: int, messages: Iterable[ClaimedMessage]) -> None:
        self._buffered[endpoint_id].extend(messages)

    def holds(self, endpoint_id: int) -> bool:
        """Whether the endpoint has a message waiting here."""
        return bool(self._buffered.get(endpoint_id))

    def take(self, endpoint_id: int) -> ClaimedMessage:
        """The endpoint's next message (holds() says there is one)."""
        return self._buffered[endpoint_id].popleft()

    def held(self, endpoint_id: int) -> int:
        return len(self._buffered[endpoint_id])

    def total(self) -> int:
        return sum(map(len, self._buffered.values()))

    def holding(self) -> list[int]:
        """The endpoints with messages waiting here."""
        return [endpoint_id for endpoint_id, buffered in self._buffered.items() if buffered]

    def messages(self) -> list[ClaimedMessage]:
        return [message for buffered in self._buffered.values() for message in buffered]

    def release(self, endpoint_id: int) -> None:
        """Give an endpoint's prefetched messages back to the queue, pending with no attempt
        counted, in the background; if that fails their leases run out and stale recovery
        takes them back."""
        messages = list(self._buffered.pop(endpoint_id, ()))
        if not messages:
            return
        self._leases.forget(message.id for message in messages)
        self._wake(endpoint_id)
        self._capacity.notify_soon()
        task = asyncio.ensure_future(self._release_quietly(messages))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def release_all(self) -> None:
        """Give every prefetched message back (a stop), and wait for it."""
        messages = self.messages()
        self._buffered.clear()
        self._leases.forget(message.id for message in messages)
        if messages:
            await self._release_quietly(messages)

    async def _release_quietly(self, messages: list[ClaimedMessage]) -> None:
        try:
            await call_with_retry(lambda: self._leases.release(messages), attempts=3)
        except Exception as error:
            log.warning("releasing prefetched messages failed; stale recovery will take them back",
                        extra={"count": len(messages), "error": one_line(error)})
