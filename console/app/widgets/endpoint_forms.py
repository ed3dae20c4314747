"""Dialogs that change endpoints: create one, or edit its retry policy.

Both validate JSON locally and then let PostgreSQL's own validation (the one
create_endpoint and alter_endpoint apply) speak through DatabaseForm.
"""

from __future__ import annotations

import json
from typing import Any

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Input, Label, Select, TextArea

from sqlkit import endpoints

from ...literal import literal
from .forms import DatabaseForm

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


class CreateEndpointForm(DatabaseForm):
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


class RetryPolicyForm(DatabaseForm):
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
