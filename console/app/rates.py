"""Delivery rates per endpoint, from the maintained delivery counters of two polls."""

from __future__ import annotations

from datetime import datetime

from sqlkit.observability import DeliveryTotals


class DeliveryRates:
    """Feed it every poll's counters; it keeps the last per-endpoint delivered/s."""

    def __init__(self) -> None:
        self._totals: dict[str, int] | None = None
        self._at: datetime | None = None
        self._measured = False
        self.per_second: dict[str, float] = {}

    def update(self, totals: dict[str, DeliveryTotals], now: datetime) -> None:
        delivered = {name: t.delivered for name, t in totals.items()}
        seconds = (now - self._at).total_seconds() if self._at else 0.0
        if seconds < 0:  # the clock was set back: start over
            self._totals, self._measured, self.per_second = None, False, {}
        # Two polls at the same instant (a fixed clock) keep the previous rates.
        if self._totals is not None and seconds > 0:
            self.per_second = {name: max(0, total - self._totals.get(name, total)) / seconds
                               for name, total in delivered.items()}
            self._measured = True
        self._totals, self._at = delivered, now

    def of(self, endpoint: str) -> float | None:
        """Delivered/s between the last two polls; None until there were two (shown "-", not a
        made-up 0)."""
        return self.per_second.get(endpoint, 0.0) if self._measured else None
