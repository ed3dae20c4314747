"""The leases this pool holds: when each was taken or last renewed, and the fenced calls
that renew them or give their messages back to the queue."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from sqlkit import queries
from sqlkit.connection import AsyncDatabase
from sqlkit.messages import ClaimedMessage


class Leases:
    """Every call carries each message's lease as claimed: one whose claim was recovered in
    the meantime (and maybe claimed again) is left alone."""

    def __init__(self, db: AsyncDatabase) -> None:
        self._db = db
        # When each held lease was taken or last renewed (monotonic), by message id.
        self._leased_at: dict[int, float] = {}

    def taken(self, message_ids: Iterable[int], at: float) -> None:
        """A claim took the messages' leases at `at` (monotonic)."""
        self._leased_at.update(dict.fromkeys(message_ids, at))

    def forget(self, message_ids: Iterable[int]) -> None:
        """The leases are no longer this pool's to renew: their outcomes were reported, or their
        messages given back."""
        leased_at = self._leased_at
        for message_id in message_ids:
            leased_at.pop(message_id, None)

    async def renew(self, held: Iterable[ClaimedMessage], renew_after: float) -> None:
        """Renew the leases of the messages in `held` taken or last renewed more than
        `renew_after` seconds ago (one not taken here is never renewed)."""
        due = time.monotonic() - renew_after
        renew = [m for m in held if self._leased_at.get(m.id, due) < due]
        if not renew:
            return
        async with self._db.connection() as conn:
            await queries.fetch_value_async(conn, "renew_leases", {
                "ids": [m.id for m in renew], "leases": [m.lease for m in renew]})
        now = time.monotonic()
        for message in renew:
            if message.id in self._leased_at:
                self._leased_at[message.id] = now

    async def release(self, messages: Sequence[ClaimedMessage]) -> None:
        """Give claimed messages back to the queue at once (release_batch, with no delay)."""
        async with self._db.connection() as conn:
            await queries.fetch_value_async(conn, "release_batch", {
                "ids": [m.id for m in messages], "leases": [m.lease for m in messages], "delay": 0})
