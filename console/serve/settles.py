"""Single settles (an ack, nack, snooze or extend by one receipt) that arrive together are
written together (groups.py): those of one kind, with the same options and token scope, that
arrive while such a write is in the database go next as one `courier.settle_in_topics` call of
many ids, each request answered with its own message's result. A message's result does not
depend on the others in the call (each is fenced by its own lease), so a group changes no
answer; two settles of the same message in one group are written one after the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlkit import queries

from .groups import Groups, Session

SettleKind = tuple[str, tuple[str, ...] | None, str | None, int | None, int]
"""What a group shares: the verb, the topics the token may consume (None: all), the nack's
error, the visibility timeout and the delay."""


class _SameMessageTwice(Exception):
    """Two settles of one message in a group: written one by one, in the order they came."""


@dataclass
class SettleGroups:
    session: Session
    _groups: Groups[SettleKind, tuple[int, int], dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self._groups = Groups(self._many, self._one)

    async def settle(self, kind: SettleKind, receipt: tuple[int, int]) -> dict[str, Any]:
        """The row settle_in_topics returns for the message of `receipt` (its id and lease)."""
        return await self._groups.submit(kind, receipt)

    async def _one(self, kind: SettleKind, receipt: tuple[int, int]) -> dict[str, Any]:
        (row,) = await self._call(kind, [receipt])
        return row

    async def _many(self, kind: SettleKind, receipts: list[tuple[int, int]]) -> list[dict[str, Any]]:
        if len({message for message, _ in receipts}) < len(receipts):
            raise _SameMessageTwice
        rows = {row["id"]: row for row in await self._call(kind, receipts)}
        return [rows[message] for message, _ in receipts]

    async def _call(self, kind: SettleKind, receipts: list[tuple[int, int]]) -> list[dict[str, Any]]:
        verb, topics, error, visibility_timeout, delay_seconds = kind
        params = {"verb": verb, "ids": [message for message, _ in receipts],
                  "leases": [lease for _, lease in receipts], "topics": list(topics) if topics is not None else None,
                  "error": error, "visibility_timeout": visibility_timeout, "delay_seconds": delay_seconds}
        async with self.session() as conn:
            return await queries.fetch_all_async(conn, "pull_settle", params)
