"""Every pane of the console, in the order of their number keys."""

from __future__ import annotations

from dataclasses import dataclass

from ..live import LivePane
from .analytics import AnalyticsPane
from .archive import ArchivePane
from .dlq import DlqPane
from .endpoints import EndpointsPane
from .events import EventsPane
from .messages import MessagesPane
from .overview import OverviewPane
from .schedules import SchedulesPane
from .tokens import TokensPane
from .workers import WorkersPane


@dataclass(frozen=True)
class PaneSpec:
    pane: type[LivePane]
    title: str
    key: str
    summary: str
    aliases: tuple[str, ...] = ()


PANES: dict[str, PaneSpec] = {
    "overview": PaneSpec(OverviewPane, "Overview", "1", "depth, throughput, DLQ and workers at a glance",
                         ("o", "home", "status")),
    "endpoints": PaneSpec(EndpointsPane, "Endpoints", "2",
                          "circuits, enable, disable, pause, purge, retry policy, topic limits, create",
                          ("ep", "endpoint", "e")),
    "messages": PaneSpec(MessagesPane, "Messages", "3", "search the queue and open a message",
                         ("msg", "m", "queue", "q")),
    "dlq": PaneSpec(DlqPane, "DLQ", "4", "dead letters: browse and redrive", ("dead", "d")),
    "archive": PaneSpec(ArchivePane, "Archive", "5", "partitions and the replay wizard", ("a", "replay")),
    "events": PaneSpec(EventsPane, "Events", "6", "live tail of the event log", ("ev", "log")),
    "workers": PaneSpec(WorkersPane, "Workers", "7", "embedded pool and remote heartbeats", ("w", "pool")),
    "analytics": PaneSpec(AnalyticsPane, "Analytics", "8", "charts from the Spark pipeline", ("an", "spark")),
    "tokens": PaneSpec(TokensPane, "Tokens", "9", "bearer tokens of the HTTP API: create, revoke",
                       ("tok", "token", "api")),
    "schedules": PaneSpec(SchedulesPane, "Schedules", "0", "periodic schedules: next and last run, pause, drop",
                          ("sched", "schedule", "cron")),
}
