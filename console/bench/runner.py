"""Runs the chosen scenarios in a scratch database and reports them."""

from __future__ import annotations

from collections.abc import Callable

from console import extras

from .brokers import dispatch_amqp, dispatch_mqtt, dispatch_nats, dispatch_redis
from .churn import churn
from .console import console_panes
from .cost import cost
from .delivery import dispatch_http, latency, mixed
from .depth import depth
from .drain import drain_noop, multi_endpoint
from .enqueue import enqueue_batch, enqueue_single
from .horizon import horizon
from .http_api import http
from .pull import pull
from .result import ScenarioResult
from .scratch import scratch_database
from .spark import spark

Scenario = Callable[..., ScenarioResult | list[ScenarioResult]]

SCENARIOS: dict[str, Scenario] = {
    "cost": cost,
    "enqueue-single": enqueue_single,
    "enqueue-batch": enqueue_batch,
    "drain-noop": drain_noop,
    "multi-endpoint": multi_endpoint,
    "dispatch-http": dispatch_http,
    "dispatch-redis": dispatch_redis,
    "dispatch-amqp": dispatch_amqp,
    "dispatch-mqtt": dispatch_mqtt,
    "dispatch-nats": dispatch_nats,
    "latency": latency,
    "mixed": mixed,
    "depth": depth,
    "console": console_panes,
    "churn": churn,
    "pull": pull,
    "http": http,
    "horizon": horizon,
    "spark": spark,
}


# Scenarios that need an optional part of Courier: checked before the scratch database is made.
NEEDS_EXTRA = {"dispatch-redis": "redis", "dispatch-amqp": "amqp", "dispatch-mqtt": "mqtt",
               "dispatch-nats": "nats", "spark": "spark"}


def run(names: list[str], dsn: str, *, clients: int, seconds: float, rounds: int,
        options: dict[str, dict[str, object]] | None = None,
        progress: Callable[[str], None] = lambda _: None) -> list[ScenarioResult]:
    """Run each scenario by name; options[name] holds keyword arguments of that scenario's own."""
    for name in names:
        if name in NEEDS_EXTRA:
            extras.require(NEEDS_EXTRA[name], f"courier bench {name}")
    results: list[ScenarioResult] = []
    with scratch_database(dsn) as bench_dsn:
        for name in names:
            progress(name)
            outcome = SCENARIOS[name](bench_dsn, clients=clients, seconds=seconds, rounds=rounds,
                                      **(options or {}).get(name, {}))
            results.extend(outcome if isinstance(outcome, list) else [outcome])
    return results
