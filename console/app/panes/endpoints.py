"""Endpoints: circuit state in colour, failures, depth and rate; enable, disable, pause or
resume, reset a circuit, edit the retry policy or a pull topic's limits, create. The last error sits beside
the circuit it explains and takes the width the counts leave; enter opens the endpoint whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import psycopg
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from sqlkit import endpoints, observability, verbs
from sqlkit.endpoints import Endpoint
from sqlkit.errors import CourierError
from sqlkit.observability import DeliveryTotals, EndpointHealth

from ..formatting import clock_time, count, one_line, rate, since, state_text, when
from ..live import LivePane
from ..rates import DeliveryRates
from ..widgets.confirm import ConfirmModal
from ..widgets.detail import DetailModal
from ..widgets.endpoint_forms import CreateEndpointForm, RetryPolicyForm
from ..widgets.live_table import CELL_LIMIT, LiveTable
from ..widgets.topic_limits import TopicLimitsForm, read_topic_limits


@dataclass(frozen=True)
class EndpointsData:
    endpoints: list[Endpoint]
    health: dict[str, EndpointHealth]
    totals: dict[str, DeliveryTotals]


def endpoint_detail(e: Endpoint, tz) -> DetailModal:
    fields = [("endpoint", e.name), ("protocol", e.protocol), ("description", e.description),
              ("enabled", "yes" if e.enabled else "no"),
              ("paused", when(e.paused_at, tz) if e.paused else "no"),
              ("circuit", "-" if e.protocol == "pull" else e.circuit_state.replace("_", "-")),
              ("failures", e.circuit_failure_count), ("pending", e.pending_messages),
              ("in flight", e.processing_messages), ("last success", when(e.last_success_at, tz)),
              ("last failure", when(e.last_failure_at, tz)), ("last error", e.last_error)]
    if e.protocol == "pull":
        fields.append(("next lease ends", when(e.next_lease_deadline, tz)))
    fields += [("created", when(e.created_at, tz)), ("updated", when(e.updated_at, tz))]
    return DetailModal(f"Endpoint {e.name}", fields,
                       documents=[("config (secrets redacted)", e.config), ("retry policy", e.retry_policy)])


class EndpointsPane(LivePane):
    TITLE_TEXT = "Endpoints"
    # Short words, full sentences in the tooltips (help shows those): seven keys and the global
    # ones must fit an 80-column key bar (78 columns inside its padding; these take all 78).
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("e", "enable", "Enable", id="endpoints.enable"),
        Binding("d", "disable", "Disable", id="endpoints.disable"),
        Binding("c", "reset_circuit", "Reset", tooltip="Reset the circuit to closed", id="endpoints.reset_circuit"),
        Binding("p", "edit_policy", "Retry", tooltip="Edit the retry policy", id="endpoints.retry_policy"),
        Binding("l", "edit_limits", "Limit", tooltip="Edit a pull topic's limits (its topic config)",
                id="endpoints.topic_limits"),
        Binding("n", "create", "New", id="endpoints.create"),
        Binding("z", "toggle_pause", "Pause",
                tooltip="Pause or resume: while paused sends are still accepted, nothing is delivered or dequeued",
                id="endpoints.pause"),
        Binding("P", "purge", "Purge", tooltip="Purge the pending messages (not those in processing), after "
                "a confirmation naming how many; they go to the archive as purged", show=False,
                id="endpoints.purge"),
        Binding("o", "open", "Open", tooltip="Open the endpoint: its last error, config and policy whole (enter)",
                show=False, id="endpoints.open"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.by_name: dict[str, Endpoint] = {}
        self.rates = DeliveryRates()

    def compose(self) -> ComposeResult:
        yield LiveTable([("name", "endpoint"), ("circuit", "circuit"), ("last_error", "last error"),
                         ("failures", "fails"), ("pending", "pending"), ("processing", "in flight"),
                         ("rate", "delivered"), ("oldest", "oldest"), ("protocol", "proto")],
                        flex="last_error", flex_min=32, id="endpoints-table")

    def fetch(self, conn: psycopg.Connection) -> EndpointsData:
        health = {h.endpoint_name: h for h in observability.endpoint_health(conn)}
        return EndpointsData(endpoints.list_all(conn), health, observability.delivery_totals(conn))

    def show(self, data: EndpointsData) -> None:
        now = self.courier.clock()
        self.rates.update(data.totals, now)
        self.by_name = {e.name: e for e in data.endpoints}
        colors = self.app.get_css_variables()
        rows = []
        for e in data.endpoints:
            health = data.health.get(e.name)
            oldest = since(health.oldest_pending_message, now) if health and health.oldest_pending_message else "-"
            state = e.circuit_state if e.enabled else "disabled"
            note = one_line(e.last_error, CELL_LIMIT)
            if e.protocol == "pull":  # a topic: no circuit; in flight are its leased messages
                state = "topic" if e.enabled else "disabled"
                note = f"{count(e.processing_messages)} leased" + (
                    f", next lease ends {clock_time(e.next_lease_deadline, self.courier.tz)}"
                    if e.next_lease_deadline else "")
            if e.enabled and e.paused:  # sends accepted, nothing delivered or dequeued
                state = "paused"
            rows.append((e.name, [e.name, state_text(state, colors), note, count(e.circuit_failure_count),
                                  count(e.pending_messages), count(e.processing_messages),
                                  rate(self.rates.of(e.name)), oldest, e.protocol]))
        self.query_one(LiveTable).sync(rows)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        if e := self._selected():
            self.app.push_screen(endpoint_detail(e, self.courier.tz))

    def _selected(self) -> Endpoint | None:
        key = self.query_one(LiveTable).current_key
        endpoint = self.by_name.get(key) if key else None
        if endpoint is None:
            self.notify("no endpoint selected", severity="warning", timeout=3)
        return endpoint

    def action_enable(self) -> None:
        if e := self._selected():
            self.write(lambda conn: endpoints.enable(conn, e.name), f"enabled {e.name}")

    def action_disable(self) -> None:
        if e := self._selected():
            self.write(lambda conn: endpoints.disable(conn, e.name), f"disabled {e.name}")

    def action_toggle_pause(self) -> None:
        if e := self._selected():
            if e.paused:
                self.write(lambda conn: endpoints.resume(conn, e.name), f"resumed {e.name}")
            else:
                self.write(lambda conn: endpoints.pause(conn, e.name),
                           f"paused {e.name}: sends are still accepted, nothing is delivered until z resumes it")

    def action_purge(self) -> None:
        if e := self._selected():
            self._count_then_purge(e.name)

    @work(thread=True, exit_on_error=False, group="count")
    def _count_then_purge(self, name: str) -> None:
        """Issue 42: purge with a confirmation that names the count (read off the depth counters)."""
        try:
            total = self.courier.database.run(lambda conn: verbs.purge_count(conn, name))
        except CourierError as error:
            self.app.call_from_thread(self.notify, error.one_line(), severity="error", timeout=5)
            return
        if total == 0:
            self.app.call_from_thread(self.notify, f"{name} has no pending message to purge", timeout=3)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.write(lambda conn: verbs.purge(conn, name, actor="console"),
                           f"purged {{result}} pending message(s) of {name}")
        self.app.call_from_thread(
            self.app.push_screen,
            ConfirmModal(f"Purge the {total:,} pending message(s) of {name}? They leave the queue for the archive "
                         "as purged; messages in processing finish normally.", "Purge"), answered)

    def action_reset_circuit(self) -> None:
        if e := self._selected():
            self.write(lambda conn: endpoints.reset_circuit(conn, e.name), f"circuit of {e.name} reset to closed")

    def action_edit_policy(self) -> None:
        if e := self._selected():
            self.app.push_screen(RetryPolicyForm(e.name, e.retry_policy), self._saved("retry policy of {} saved"))

    def action_edit_limits(self) -> None:
        e = self._selected()
        if e is None:
            return
        if e.protocol != "pull":
            self.notify(f"{e.name} is a push endpoint: limits are a pull topic's (p edits its retry policy)",
                        severity="warning", timeout=4)
            return
        self._open_limits(e.name)

    @work(thread=True, exit_on_error=False, group="limits")
    def _open_limits(self, topic: str) -> None:
        try:
            limits = self.courier.database.run(lambda conn: read_topic_limits(conn, topic))
        except CourierError as error:
            self.app.call_from_thread(self.notify, error.one_line(), severity="error", timeout=5)
            return
        self.app.call_from_thread(self.app.push_screen, TopicLimitsForm(limits), self._saved("limits of {} saved"))

    def action_create(self) -> None:
        self.app.push_screen(CreateEndpointForm(), self._saved("endpoint {} created"))

    def _saved(self, message: str):
        def done(name: str | None) -> None:
            if name:
                self.notify(message.format(name), timeout=4)
                self.poll_now()
        return done
