"""Every pane of the console, in the order of their number keys."""

from __future__ import annotations

from dataclasses import dataclass

from textual.screen import Screen

from .analytics import AnalyticsScreen
from .archive import ArchiveScreen
from .dlq import DlqScreen
from .endpoints import EndpointsScreen
from .events import EventsScreen
from .messages import MessagesScreen
from .overview import OverviewScreen
from .workers import WorkersScreen


@dataclass(frozen=True)
class PaneSpec:
    screen: type[Screen]
    title: str
    key: str
    summary: str
    aliases: tuple[str, ...] = ()


SCREENS: dict[str, PaneSpec] = {
    "overview": PaneSpec(OverviewScreen, "Overview", "1", "depth, throughput, DLQ and workers at a glance",
                         ("o", "home", "status")),
    "endpoints": PaneSpec(EndpointsScreen, "Endpoints", "2", "circuits, enable, disable, retry policy, create",
                          ("ep", "endpoint", "e")),
    "messages": PaneSpec(MessagesScreen, "Messages", "3", "search the queue and open a message",
                         ("msg", "m", "queue", "q")),
    "dlq": PaneSpec(DlqScreen, "DLQ", "4", "dead letters: browse and redrive", ("dead", "d")),
    "archive": PaneSpec(ArchiveScreen, "Archive", "5", "partitions and the replay wizard", ("a", "replay")),
    "events": PaneSpec(EventsScreen, "Events", "6", "live tail of the event log", ("ev", "log")),
    "workers": PaneSpec(WorkersScreen, "Workers", "7", "embedded pool and remote heartbeats", ("w", "pool")),
    "analytics": PaneSpec(AnalyticsScreen, "Analytics", "8", "charts from the Spark pipeline", ("an", "spark")),
}
