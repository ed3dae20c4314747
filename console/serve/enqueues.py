"""Single enqueues that arrive together are written together (groups.py): the enqueues that
arrive for a topic while its write is in the database go next as one `courier.enqueue_batch`,
one statement, counter write, wake-up and commit for the lot, where each alone cost a call of
`courier.enqueue` and a commit (about 650,000 instructions of the database's CPU each, against
about 60,000 a message in a batch). A keyed message (it may replace another) is always written
on its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from sqlkit import queries

from .groups import Groups, Session


@dataclass
class EnqueueGroups:
    session: Session
    _groups: Groups[str, dict[str, Any], int] = field(init=False)

    def __post_init__(self) -> None:
        self._groups = Groups(self._many, self._one)

    async def enqueue(self, params: dict[str, Any]) -> int:
        """The id of the message `params` (pull_enqueue's parameters) describes, once committed."""
        if params["key"] is not None:
            return await self._one(params["topic"], params)
        return await self._groups.submit(params["topic"], params)

    async def _one(self, topic: str, params: dict[str, Any]) -> int:
        async with self.session() as conn:
            return await queries.fetch_value_async(conn, "pull_enqueue", params)

    async def _many(self, topic: str, group: list[dict[str, Any]]) -> list[int]:
        async with self.session() as conn:
            return await enqueue_run(conn, group)


async def enqueue_run(conn: psycopg.AsyncConnection, run: list[dict[str, Any]]) -> list[int]:
    """Enqueue unkeyed messages of one topic (pull_enqueue's parameters each) in one statement;
    their ids, in order."""
    def column(name: str) -> list[Any] | None:
        values = [params[name] for params in run]
        return None if all(value is None for value in values) else values

    return await queries.fetch_value_async(conn, "pull_enqueue_batch", {
        "topic": run[0]["topic"], "payloads": [params["payload"] for params in run],
        **{name: column(name) for name in ("metadata", "scheduled_at", "ttl_seconds", "max_retries")}})
