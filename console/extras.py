"""Optional parts of Courier and the packages each needs.

The core install (SQL layer, worker with HTTP delivery, console, CLI, embedded PostgreSQL)
needs none of these. A command or an endpoint that does names the extra to install in one
line, before it starts, instead of failing with an ImportError half-way.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

from sqlkit.errors import CourierError


@dataclass(frozen=True)
class Extra:
    name: str
    modules: tuple[str, ...]  # the import names that must be present
    purpose: str

    @property
    def install(self) -> str:
        return f"pip install 'courier[{self.name}]'"

    def missing_modules(self) -> list[str]:
        return [module for module in self.modules if importlib.util.find_spec(module) is None]

    def installed(self) -> bool:
        return not self.missing_modules()


EXTRAS: dict[str, Extra] = {extra.name: extra for extra in (
    Extra("spark", ("pyspark", "pyarrow"), "the data pipeline (courier pipeline ..., courier bench spark)"),
    Extra("redis", ("redis",), "delivery to redis endpoints"),
    Extra("amqp", ("aio_pika",), "delivery to amqp (RabbitMQ) endpoints"),
    Extra("mqtt", ("aiomqtt", "paho"), "delivery to mqtt endpoints"),
    Extra("nats", ("nats",), "delivery to nats endpoints"),
    Extra("peers", ("pgmq",), "the peer queues `courier bench` measures Courier against (pgmq)"),
)}

# Which extra an endpoint protocol needs; http and noop need none.
PROTOCOL_EXTRAS: dict[str, str] = {"redis": "redis", "amqp": "amqp", "mqtt": "mqtt", "nats": "nats"}


class MissingExtra(CourierError):
    """A part of Courier that is not installed."""


def require(name: str, needed_for: str | None = None) -> None:
    """Raise MissingExtra, naming the pip command, unless extra `name` is installed."""
    extra = EXTRAS[name]
    missing = extra.missing_modules()
    if missing:
        raise MissingExtra(f"{needed_for or extra.purpose} needs {', '.join(missing)}, which "
                           f"{'is' if len(missing) == 1 else 'are'} not installed", hint=extra.install)


@functools.cache
def deliverable_protocols() -> list[str]:
    """What a worker of this install can deliver: http and noop, and each broker whose client's
    extra is installed (reported with its heartbeat, so others can tell what no worker can)."""
    return ["http", "noop", *(p for p, name in PROTOCOL_EXTRAS.items() if EXTRAS[name].installed())]


def for_protocol(protocol: str) -> Extra | None:
    """The extra an endpoint protocol needs, or None (http, noop)."""
    name = PROTOCOL_EXTRAS.get(protocol)
    return EXTRAS[name] if name else None
