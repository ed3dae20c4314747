"""The pool's settings and statistics, its share of a worker's limits, and the constants
they rest on; console.workers.pool re-exports them, where callers import them from."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from sqlkit import linger as linger_defaults

from .maintenance import MaintenanceSchedule

MAX_CONCURRENCY = 10_000
"""The most messages one pool may have in flight (as `courier worker --concurrency` allows)."""

HTTP_DEFAULT_CONCURRENCY = 64
"""Requests one webhook gets at once when its endpoint sets no concurrency."""


def default_concurrency() -> int:
    """Messages in flight by default: two claims of a full batch ahead per core, so a claim of
    a full batch is always possible while the previous one is being delivered and reported.
    Draining no-op messages on two cores, claims of 500 with 1,024 in flight measured about
    twice the rate of claims of 100 with 256 (0.002 round trips per message instead of 0.01);
    a webhook still gets at most HTTP_DEFAULT_CONCURRENCY requests at once."""
    return 512 * max(1, min(os.cpu_count() or 1, 8))


@dataclass(frozen=True)
class Share:
    """Which of the worker's pools this is, when `courier worker --processes N` runs N of them
    (pool `index` of `count`): limits meant for the whole worker, an endpoint's
    config.concurrency and a webhook's default, are split between them, so that N pools
    together never have more requests in flight to an endpoint than one pool would."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"share index must be between 0 and {self.count - 1}, not {self.index}")

    def of(self, total: int) -> int:
        """This pool's part of total: the parts differ by at most one and add up to total (an
        endpoint allowed one request at a time gets it from pool 0 only)."""
        return total // self.count + (1 if self.index < total % self.count else 0)


@dataclass
class PoolSettings:
    concurrency: int = field(default_factory=default_concurrency)
    """Messages in flight at once across all endpoints; also the limit of an endpoint
    without its own config.concurrency."""
    batch_size: int = 500
    """Most messages one claim takes."""
    poll_interval: float = 1.0
    """Seconds between claims of an idle endpoint when no notification arrives."""
    linger: tuple[float, ...] = linger_defaults.PAUSES
    """Pauses (seconds) between the claims of an endpoint's linger: after a wake-up, while a
    claim comes back empty and producers that sent to it are still committing, it claims again
    after the next pause (the last one repeats, for at most linger_limit seconds). Of the
    producers committing together, only one NOTIFYs (see sqlkit/linger.py); the others may
    become visible just after the claim that NOTIFY set off, and the linger picks their
    messages up instead of the poll a poll_interval later."""
    linger_limit: float = linger_defaults.LIMIT
    """Most seconds one linger lasts: producers that take longer to commit wait for the poll."""
    report_interval: float = 0.005
    """Seconds outcomes may wait for an endpoint's next claim to carry them (report_and_claim)
    while some endpoint's claims come back full; otherwise they are reported at once, and
    outcomes that arrive during a report go together in the next."""
    drain_timeout: float = 30.0
    """Seconds a graceful stop waits for in-flight deliveries before releasing them."""
    refresh_interval: float = 2.0
    """Seconds between re-reads of the endpoint list."""
    heartbeat_interval: float = 5.0
    """Seconds between heartbeats, and between checks for leases to renew."""
    renew_after: float | None = None
    """Seconds a lease is held before the pool renews it (default: a third of the database's
    stale_recovery_timeout), so stale recovery never takes a slow delivery from a live worker."""
    claimers: int = 2
    """Claims one endpoint may have on their way at once; beyond the first, only while claims
    come back full. An endpoint dispatched one message at a time (HTTP) has one, so that its
    messages go out in priority order (see Claims._endpoint_loop in claiming.py)."""
    max_unreported: int = 5_000
    """Most outcomes waiting to be reported; past it the pool claims nothing new until the
    reporter catches up, so a database that refuses reports cannot grow memory without end."""
    maintenance: MaintenanceSchedule | None = field(default_factory=MaintenanceSchedule)
    """The schedule this pool runs if it is elected maintenance leader; None never stands."""
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}")
    share: Share = field(default_factory=Share)
    """This pool's part of the per-endpoint limits when several pools make up one worker
    (`concurrency` above is already this pool's own)."""


@dataclass
class PoolStats:
    delivered: int = 0
    failed: int = 0
    dead_lettered: int = 0
    stale_reports: int = 0
    round_trips: int = 0
    """Database calls of the claim loops and the reporter (the hot path)."""
    lone_reports: int = 0
    """Of those, reports that went in a round trip of their own rather than with a claim."""
