"""Plain sends to a push endpoint that arrive together are written together (groups.py): those
for one endpoint, by tokens of the same scope, with a payload and no option, that arrive while
such a write is in the database go next as one `courier.send_batch`, each answered with its own
id. A send with any option (priority, keys, schedule, headers, ...) is written on its own, and a
lone plain send as a single send. Like every batch, a group of several wakes the endpoint's
workers once at commit, `notify_on_send` or not."""

from __future__ import annotations

from dataclasses import dataclass, field

from psycopg.types.json import Jsonb

from sqlkit import queries

from .groups import Groups, Session

SendKind = tuple[str, tuple[str, ...] | None]
"""What a group shares: the endpoint, and the topics the token may enqueue to (None: all)."""


@dataclass
class SendGroups:
    session: Session
    _groups: Groups[SendKind, Jsonb, int | None] = field(init=False)

    def __post_init__(self) -> None:
        self._groups = Groups(self._many, self._one)

    async def send(self, kind: SendKind, payload: Jsonb) -> int | None:
        """The new message's id; None when the endpoint is a pull topic outside the scope."""
        return await self._groups.submit(kind, payload)

    async def _one(self, kind: SendKind, payload: Jsonb) -> int | None:
        """Alone, a send is a single send (so `notify_on_send` holds for it)."""
        endpoint, topics = kind
        async with self.session() as conn:
            return await queries.fetch_value_async(conn, "send_to_endpoint", {
                "endpoint": endpoint, "payload": payload, "priority": 0, "scheduled_at": None,
                "idempotency_key": None, "correlation_id": None, "expires_at": None, "ordering_key": None,
                "headers": None, "metadata": None, "max_retries": None, "unique_by_payload": False,
                "unique_period_seconds": None, "topics": list(topics) if topics is not None else None})

    async def _many(self, kind: SendKind, payloads: list[Jsonb]) -> list[int | None]:
        endpoint, topics = kind
        async with self.session() as conn:
            ids = await queries.fetch_value_async(conn, "send_batch_to_endpoint", {
                "endpoint": endpoint, "payloads": payloads, "topics": list(topics) if topics is not None else None})
        return list(ids) if ids is not None else [None] * len(payloads)
