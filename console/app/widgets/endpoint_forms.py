"""Dialogs that change endpoints: create one, or edit its retry policy.

Both validate JSON locally and then let PostgreSQL's own validation (the one
create_endpoint and alter_endpoint apply) speak through DatabaseForm. Their fields are
compact, one line each where they can be, so the whole form fits 80x24.
"""

from __future__ import annotations

import json
from typing import Any

from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Input, Label, Select, Static, TextArea

from sqlkit import endpoints

from ...literal import literal
from .forms import DatabaseForm

# What a worker delivers to, and a pull topic (consumers take its messages); as `courier
# endpoint create` offers them.
PROTOCOLS = ("http", "redis", "amqp", "mqtt", "nats", "noop", "pull")
CONFIG_EXAMPLES = {
    "http": '{"url": "https://example.com/hook"}',
    "redis": '{"url": "redis://redis.example.com:6379/0", "stream": "orders"}',
    "amqp": '{"url": "amqp://user:pass@mq.example.com/", "exchange": "orders", "routing_key": "created"}',
    "mqtt": '{"url": "mqtt://mqtt.example.com:1883", "topic": "orders/created", "qos": 1}',
    "nats": '{"url": "nats://nats.example.com:4222", "subject": "orders.created"}',
    "noop": "{}",
    "pull": '{"visibility_timeout": 60}',
}
CONFIG_EXAMPLE = CONFIG_EXAMPLES["http"]
POLICY_KEYS = ("max_retries, backoff (fixed|linear|exponential), base_delay_seconds, max_delay_seconds, "
               "increment_seconds")



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
    SUBMIT_LABEL = "Create"
    DEFAULT_CSS = """
    CreateEndpointForm #endpoint-fields {
        grid-size: 2; grid-columns: 12 1fr; grid-gutter: 0 1; grid-rows: 1; height: auto; margin-top: 1;
    }
    CreateEndpointForm Input, CreateEndpointForm TextArea { background: $boost; }
    CreateEndpointForm Input:focus, CreateEndpointForm TextArea:focus { background: $primary 30%; }
    CreateEndpointForm TextArea { height: 3; }
    """

    def fields(self) -> ComposeResult:
        yield Label("Create an endpoint", classes="title")
        with Grid(id="endpoint-fields"):
            yield Label("name")
            yield Input(placeholder="billing (letters, digits, _ . : -)", compact=True, id="name")
            yield Label("protocol")
            yield Select([(p, p) for p in PROTOCOLS], value="http", allow_blank=False, compact=True, id="protocol")
            yield Label("description")
            yield Input(placeholder="optional", compact=True, id="description")
        yield Label("config (JSON; the README lists each protocol's settings)", classes="field")
        yield TextArea("", language=None, compact=True, id="config", placeholder=CONFIG_EXAMPLE)
        yield Label("retry policy (JSON; blank: the defaults)", classes="field")
        yield TextArea("", compact=True, id="retry-policy", placeholder='{"max_retries": 5, "backoff": "exponential"}')
        yield Static(f"keys: {POLICY_KEYS}", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#name", Input).focus()

    def on_select_changed(self, event: Select.Changed) -> None:
        """A new protocol brings its example config, as the placeholder: nothing to type in
        front of or delete first."""
        self.query_one("#config", TextArea).placeholder = CONFIG_EXAMPLES.get(str(event.value), "{}")

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
    DEFAULT_CSS = """
    RetryPolicyForm #retry-policy { height: 8; background: $boost; }
    RetryPolicyForm #retry-policy:focus { background: $primary 30%; }
    """

    def __init__(self, endpoint: str, policy: dict[str, Any]) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.policy = policy

    def fields(self) -> ComposeResult:
        yield Label(literal(f"Retry policy of {self.endpoint}"), classes="title")
        yield Static(f"keys: {POLICY_KEYS}; {{}}: the defaults", classes="hint")
        yield Label("retry policy (JSON)", classes="field")
        yield TextArea(json.dumps(self.policy, indent=2), compact=True, id="retry-policy")

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
