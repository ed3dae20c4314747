"""The maintenance leader's WARNING lines for what changes an endpoint's state: each circuit
that opens, reopens, half-opens or closes, and each endpoint disabled on its own. SQL records
them in the event log as reports and claims change them, in whichever worker; the leader (one
across every worker) reads the new ones each second and logs each once, so an operator running
`courier worker` under systemd or Kubernetes learns of them from the log, not only from
`courier status`. A leader starts from the events logged since its process started: older
history stays in the event log, and a takeover repeats at most the last second's lines."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import psycopg

from sqlkit.errors import translated

log = logging.getLogger("courier.worker")

EVENTS = ("circuit.opened", "circuit.reopened", "circuit.half_open", "circuit.closed", "endpoint.auto_disabled")
MOST_PER_LOOK = 200

_BEFORE = "SELECT coalesce(max(id), 0) FROM courier.event_log WHERE created_at < %(started)s"
_AFTER = """
SELECT l.id, l.event_type, coalesce(e.name, l.details ->> 'name') AS endpoint, l.details
FROM courier.event_log l LEFT JOIN courier.endpoints e ON e.id = l.endpoint_id
WHERE l.id > %(after)s AND l.event_type = ANY (%(events)s)
ORDER BY l.id
LIMIT %(limit)s
"""


class CircuitLog:
    def __init__(self) -> None:
        self._after: int | None = None
        self._started = datetime.now(UTC)

    async def __call__(self, conn: psycopg.AsyncConnection) -> int:
        """Log the state changes since the last look; how many."""
        with translated():
            if self._after is None:
                cursor = await conn.execute(_BEFORE, {"started": self._started})
                self._after = int((await cursor.fetchone())[0])
            cursor = await conn.execute(_AFTER, {"after": self._after, "events": list(EVENTS),
                                                 "limit": MOST_PER_LOOK})
            rows = await cursor.fetchall()
        for event_id, event_type, endpoint, details in rows:
            self._after = event_id
            closed = event_type == "circuit.closed"
            (log.info if closed else log.warning)(_WORDS[event_type], extra={
                "endpoint": endpoint, "event": event_type,
                **{key: value for key, value in (details or {}).items() if key != "name"}})
        return len(rows)


_WORDS = {"circuit.opened": "circuit opened", "circuit.reopened": "circuit reopened",
          "circuit.half_open": "circuit half-open: trying one delivery", "circuit.closed": "circuit closed",
          "endpoint.auto_disabled": "endpoint disabled automatically"}
