"""The topic-config editor (queue-ti's admin Config tab): a pull topic's own limits, each
blank where the topic takes the global default, saved through courier.alter_topic."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Input, Label, Static

from sqlkit import endpoints, pull, settings
from sqlkit.settings import Setting

from ...literal import literal
from .forms import DatabaseForm


@dataclass(frozen=True)
class Limit:
    key: str
    setting: str
    """The global setting a topic without its own value takes."""
    whole: bool = True
    zero: str = ""
    """What 0 means, where it means something other than a count of 0."""


LIMITS = (
    Limit("max_retries", "default_max_retries"),
    Limit("message_ttl_seconds", "default_message_ttl", zero="no TTL"),
    Limit("max_depth", "default_max_depth", zero="unlimited"),
    Limit("throughput_limit", "default_throughput_limit", whole=False, zero="unlimited"),
    Limit("dlq_threshold", "default_dlq_threshold", zero="no DLQ"),
    Limit("visibility_timeout", "visibility_timeout"),
)
OWN_SETTINGS = (Limit("delay_seconds", "", zero="none"),)
"""A topic's settings with no global setting behind them (blank: none)."""
_WHOLE = re.compile(r"-?\d+")
_NUMBER = re.compile(r"-?(\d+(\.\d*)?|\.\d+)")


@dataclass(frozen=True)
class TopicLimits:
    """A topic's own limits (its config) and the global settings behind the ones it leaves unset."""

    topic: str
    overrides: dict[str, Any]
    defaults: dict[str, Setting]


def read_topic_limits(conn: psycopg.Connection, topic: str) -> TopicLimits:
    config = endpoints.get(conn, topic).config
    wanted = {limit.setting for limit in LIMITS}
    defaults = {s.name: s for s in settings.list_all(conn) if s.name in wanted}
    return TopicLimits(topic, {k: v for k, v in config.items() if v is not None}, defaults)


def parse_limit(limit: Limit, text: str) -> int | float | None:
    """The number typed (None when blank: the global default), or ValueError naming the field."""
    text = text.strip()
    if not text:
        return None
    if limit.whole:
        if not _WHOLE.fullmatch(text):
            raise ValueError(f"{limit.key}: {text!r} is not a whole number (blank: the global default)")
        return int(text)
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"{limit.key}: {text!r} is not a number (blank: the global default)")
    value = Decimal(text)
    return int(value) if value == value.to_integral_value() else float(value)


def _shown(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


class TopicLimitsForm(DatabaseForm):
    DEFAULT_CSS = """
    TopicLimitsForm #limits {
        grid-size: 3; grid-columns: 21 12 1fr; grid-gutter: 0 1; grid-rows: 1; height: auto; margin-top: 1;
    }
    TopicLimitsForm #limits Input { background: $boost; }
    TopicLimitsForm #limits Input:focus { background: $primary 30%; }
    TopicLimitsForm #limits-help { color: $text-muted; margin-top: 1; }
    """

    def __init__(self, limits: TopicLimits) -> None:
        super().__init__()
        self.limits = limits

    def fields(self) -> ComposeResult:
        yield Label(literal(f"Limits of topic {self.limits.topic}"), classes="title")
        yield Static("Blank: the global default (greyed). Applies to the next send or take.",
                     id="limits-help")
        with Grid(id="limits"):
            for limit in LIMITS + OWN_SETTINGS:
                default = self.limits.defaults.get(limit.setting)
                shown = _shown(self.limits.overrides.get(limit.key))
                yield Label(limit.key, classes="name")
                placeholder = default.value if default else ("0" if not limit.setting else "default")
                yield Input(shown, placeholder=placeholder, compact=True, id=limit.key)
                yield Label(literal(self._hint(limit, default)), classes="hint")

    @staticmethod
    def _hint(limit: Limit, default: Setting | None) -> str:
        if not limit.setting:
            return f"seconds; blank or 0: {limit.zero}"
        if default is None:
            return "default: the global setting"
        text = f"default {default.value}{' ' + default.unit if default.unit else ''}"
        return f"{text}; 0: {limit.zero}" if limit.zero else text

    def on_mount(self) -> None:
        self.query_one(f"#{LIMITS[0].key}", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_submit()

    def changes(self) -> dict[str, Any]:
        """What differs from the topic's config, a blank as None (back to the default);
        ValueError for the first field that is not a number."""
        changed: dict[str, Any] = {}
        for limit in LIMITS + OWN_SETTINGS:
            value = parse_limit(limit, self.query_one(f"#{limit.key}", Input).value)
            if value != self.limits.overrides.get(limit.key):
                changed[limit.key] = value
        return changed

    def action_submit(self) -> None:
        try:
            changed = self.changes()
        except ValueError as error:
            self.show_error(str(error))
            return
        if not changed:
            self.notify("no limit changed", timeout=3)
            self.dismiss(None)
            return
        self.show_error("")
        topic = self.limits.topic
        self.save(lambda conn: pull.alter_topic(conn, topic, changed), topic)
