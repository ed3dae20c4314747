"""Dialogs that change endpoints: create one, or edit its retry policy.

Both validate JSON locally and then let PostgreSQL's own validation (the one
create_endpoint and alter_endpoint apply) speak: its error is shown inline, and the dialog
stays open with nothing stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar

import psycopg
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from sqlkit import endpoints
from sqlkit.errors import CourierError

from ...literal import literal

PROTOCOLS = ("http", "redis", "amqp", "mqtt", "nats", "noop")  # what a worker can deliver to
CONFIG_EXAMPLE = '{"url": "https://example.com/hook"}'


def parse_object(text: str, field: str) -> dict[str, Any] | None:
    """The JSON object in text (None when blank), or ValueError naming the field."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{field}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{field}: must be a JSON object")
    return value


class _DatabaseForm(ModalScreen[str | None]):
    """A form whose submit runs one database change in a thread and shows its error inline."""

    DEFAULT_CSS = """
    _DatabaseForm { align: center middle; }
    _DatabaseForm > VerticalScroll {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    _DatabaseForm Label.field { margin-top: 1; color: $text-muted; }
    _DatabaseForm TextArea { height: 5; }
    _DatabaseForm .form-error { color: $error; text-style: bold; height: auto; margin-top: 1; }
    _DatabaseForm Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    _DatabaseForm Button { margin-left: 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="form.cancel"),
        Binding("ctrl+s", "submit", "Save", id="form.save"),
    ]

    def error_line(self) -> Static:
        return Static("", classes="form-error", id="form-error")

    def buttons(self, submit_label: str) -> ComposeResult:
        with Horizontal():
            yield Button("Cancel (esc)", id="cancel")
            yield Button(f"{submit_label} (ctrl+s)", id="submit", variant="primary")

    def show_error(self, text: str) -> None:
        self.query_one("#form-error", Static).update(literal(text, lines=True))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "submit":
            self.action_submit()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_submit(self) -> None:
        raise NotImplementedError

    @work(thread=True, exclusive=True, group="form", exit_on_error=False)
    def save(self, change: Callable[[psycopg.Connection], Any], result: str) -> None:
        try:
            self.app.database.run(change)  # type: ignore[attr-defined]
        except CourierError as error:
            self.app.call_from_thread(self.show_error, error.one_line())
            return
        self.app.call_from_thread(self.dismiss, result)


class CreateEndpointForm(_DatabaseForm):
    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Label("Create an endpoint", classes="title")
            yield Label("name", classes="field")
            yield Input(placeholder="billing", id="name")
            yield Label("protocol", classes="field")
            yield Select([(p, p) for p in PROTOCOLS], value="http", allow_blank=False, id="protocol")
            yield Label("config (JSON)", classes="field")
            yield TextArea(CONFIG_EXAMPLE, language=None, id="config")
            yield Label("retry policy (JSON, optional)", classes="field")
            yield TextArea("", id="retry-policy")
            yield Label("description (optional)", classes="field")
            yield Input(id="description")
            yield self.error_line()
            yield from self.buttons("Create")

    def on_mount(self) -> None:
        self.query_one("#name", Input).focus()

    def action_submit(self) -> None:
        name = self.query_one("#name", Input).value.strip()
        protocol = str(self.query_one("#protocol", Select).value)
        description = self.query_one("#description", Input).value.strip() or None
        if not name:
            self.show_error("name: required")
            return
        try:
            config = parse_object(self.query_one("#config", TextArea).text, "config") or {}
            policy = parse_object(self.query_one("#retry-policy", TextArea).text, "retry policy")
        except ValueError as error:
            self.show_error(str(error))
            return
        self.show_error("")
        self.save(lambda conn: endpoints.create(conn, name, protocol, config, policy, description), name)


class RetryPolicyForm(_DatabaseForm):
    def __init__(self, endpoint: str, policy: dict[str, Any]) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.policy = policy

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Label(literal(f"Retry policy of {self.endpoint}"), classes="title")
            yield Label("keys: max_retries, backoff (fixed|linear|exponential), base_delay_seconds, "
                        "max_delay_seconds, increment_seconds", classes="field")
            yield TextArea(json.dumps(self.policy, indent=2), id="retry-policy")
            yield self.error_line()
            yield from self.buttons("Save")

    def on_mount(self) -> None:
        self.query_one("#retry-policy", TextArea).focus()

    def action_submit(self) -> None:
        try:
            policy = parse_object(self.query_one("#retry-policy", TextArea).text, "retry policy")
        except ValueError as error:
            self.show_error(str(error))
            return
        if policy is None:
            self.show_error("retry policy: required (use {} for the defaults)")
            return
        self.show_error("")
        self.save(lambda conn: endpoints.alter(conn, self.endpoint, retry_policy=policy), self.endpoint)
