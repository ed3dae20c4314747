"""Plain sends to a push endpoint that arrive together are written together (groups.py): those
for one endpoint, by tokens of the same scope, with a payload and no option, that arrive while
such a write is in the database go next as one `courier.send_batch`, each answered with its own
id. A send with any option (priority, keys, schedule, headers, ...) is written on its own, and a
lone plain send as a single send. Like every batch, a group of several wakes the endpoint's
workers once at commit, `notify_on_send` or not."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlkit import queries

from .groups import Groups, Session

SendKind = tuple[str, tuple[str, ...] | None]
"""What a group shares: the endpoint, and the topics the token may enqueue to (None: all)."""


@dataclass
class SendGroups:
    session: Session
    _groups: Groups[SendKind, dict[str, Any], int | None] = field(init=False)

    def __post_init__(self) -> None:
        self._groups = Groups(self._many, self._one)

    async def send(self, params: dict[str, Any]) -> int | None:
        """The id of the plain send `params` (send_to_endpoint's parameters) describes; None when
        the endpoint is a pull topic outside the token's topics."""
        topics = params["topics"]
        return await self._groups.submit((params["endpoint"], tuple(topics) if topics is not None else None), params)

    async def _one(self, kind: SendKind, params: dict[str, Any]) -> int | None:
        """Alone, a send is a single send (so `notify_on_send` holds for it)."""
        async with self.session() as conn:
            return await queries.fetch_value_async(conn, "send_to_endpoint", params)

    async def _many(self, kind: SendKind, group: list[dict[str, Any]]) -> list[int | None]:
        async with self.session() as conn:
            ids = await queries.fetch_value_async(conn, "send_batch_to_endpoint", {
                **group[0], "payloads": [params["payload"] for params in group]})
        return list(ids) if ids is not None else [None] * len(group)
