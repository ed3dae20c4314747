"""Dequeues that arrive together are written together (groups.py): those of one topic, with the
same visibility timeout, that arrive while such a dequeue is in the database go next as one
`courier.dequeue` of all their counts, and each request takes its count of the messages leased,
in the order they came. A consumer dequeuing one message at a time over HTTP cost the database
a dequeue of one each; under load it now costs a share of a dequeue of many. Each request was
authorised for the topic before it joined the line, so requests of different tokens share one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlkit import queries

from .groups import Groups, Session

MAX_DEQUEUE = 10_000
"""The most messages one courier.dequeue takes (its p_count)."""

DequeueKind = tuple[str, int | None]
"""What a group shares: the topic and the visibility timeout (None: the topic's)."""


@dataclass
class DequeueGroups:
    session: Session
    _groups: Groups[DequeueKind, int, list[dict[str, Any]]] = field(init=False)

    def __post_init__(self) -> None:
        self._groups = Groups(self._many, self._one)

    async def dequeue(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The rows pull_dequeue returns for `params` (topic, count, visibility_timeout)."""
        return await self._groups.submit((params["topic"], params["visibility_timeout"]), params["count"])

    async def _one(self, kind: DequeueKind, count: int) -> list[dict[str, Any]]:
        topic, visibility_timeout = kind
        async with self.session() as conn:
            return await queries.fetch_all_async(conn, "pull_dequeue", {
                "topic": topic, "count": count, "visibility_timeout": visibility_timeout})

    async def _many(self, kind: DequeueKind, counts: list[int]) -> list[list[dict[str, Any]]]:
        shares: list[list[dict[str, Any]]] = []
        for chunk in _chunks(counts):
            rows = await self._one(kind, sum(chunk))
            start = 0
            for count in chunk:
                shares.append(rows[start:start + count])
                start += count
        return shares


def _chunks(counts: list[int]) -> list[list[int]]:
    """The counts in order, cut where a dequeue would ask for more than it takes at once."""
    chunks: list[list[int]] = [[]]
    for count in counts:
        if chunks[-1] and sum(chunks[-1]) + count > MAX_DEQUEUE:
            chunks.append([])
        chunks[-1].append(count)
    return chunks
