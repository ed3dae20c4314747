"""The linger after a wake-up, shared by every loop that waits on courier_new_msg.

Of the producers committing together to an endpoint or topic, only one NOTIFYs (see the top
of sqlkit/functions/sending.sql); the others may become visible just after the claim or
dequeue that NOTIFY set off. So a claim or dequeue that comes back empty after a wake-up asks
whether producers are still committing (courier.sends_committing, or
courier.topic_sends_committing by a topic's name): while some are, it looks again after the
next pause; once none is, one more look at once sees every commit that was under way, and an
empty look after that ends the linger. A look that asks first, in its own round trip (the
worker's report_and_claim), needs no look after it: after_asked."""

from __future__ import annotations

import time

PAUSES: tuple[float, ...] = (0.0005, 0.001, 0.002, 0.004, 0.008)
"""Seconds between the looks of a linger; the last one repeats."""

LIMIT = 0.5
"""Most seconds one linger lasts: producers that take longer to commit wait for the poll."""


class Linger:
    def __init__(self, pauses: tuple[float, ...] = PAUSES, limit: float = LIMIT) -> None:
        self._pauses = pauses
        self._limit = limit
        self._step = 0
        self._until = 0.0
        self.active = False
        self.final = False

    def start(self) -> None:
        self.active = bool(self._pauses)
        self.final = False
        self._step = 0
        self._until = time.monotonic() + self._limit

    def stop(self) -> None:
        self.active = False

    def asks(self) -> bool:
        """After an empty look: whether to ask if producers are still committing. False (and
        the linger over) when it is not lingering or its final look came back empty too."""
        if not self.active or self.final:
            self.active = False
            return False
        return True

    def asks_with_claim(self) -> bool:
        """Whether the next claim should ask whether producers are committing, in the claim's
        own round trip (report_and_claim's p_linger): while lingering, before its final look."""
        return self.active and not self.final

    def after_asked(self, committing: bool) -> float | None:
        """After an empty look that asked, before it looked, whether producers were committing:
        seconds to wait before the next look, or None when the linger is over. A look that
        found nothing when none was committing was the final one already."""
        if not committing:
            self.active = False
            return None
        return self.next_pause(True)

    def next_pause(self, committing: bool) -> float | None:
        """Seconds to wait before the next look, or None when the linger is over."""
        if not committing:
            self.final = True
            return 0.0
        if time.monotonic() > self._until:
            self.active = False
            return None
        pause = self._pauses[min(self._step, len(self._pauses) - 1)]
        self._step += 1
        return pause
