"""Prometheus text exposition of one metrics() snapshot, rendered by prometheus_client."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sqlkit.observability import Metric as CourierMetric

PREFIX = "courier_"
HELP = {
    "queue_depth": "Messages in the queue by status.",
    "queue_depth_by_endpoint": "Messages in the queue by endpoint and status.",
    "oldest_message_age_seconds": "Age of the oldest pending message.",
    "dlq_depth": "Dead-letter queue entries by endpoint and status.",
    "endpoint_circuit_state": "Circuit breaker state: 0 closed, 1 half_open, 2 open.",
    "endpoint_enabled": "1 if the endpoint is enabled.",
    "endpoint_paused": "1 if the endpoint is paused: sends accepted, nothing claimed or dequeued.",
    "messages_delivered_total": "Messages delivered.",
    "delivery_failures_total": "Failed delivery attempts.",
    "messages_dead_lettered_total": "Messages moved to the dead-letter queue.",
    "messages_failed_total": "Pull messages past their retries on a topic without a DLQ (dlq_threshold 0).",
    "messages_expired_total": "Messages that expired before delivery.",
    "messages_replayed_total": "Messages enqueued again from the archive.",
    "claims_busy_total": "Worker claims that found every claim slot of the endpoint taken, and waited "
                         "(courier config set claim_slots N allows more at once).",
    "stale_reports_total": "Reports and releases refused because their claim's lease had been recovered.",
    "workers_alive": "Worker processes with a recent heartbeat.",
    "maintenance_leader_present": "1 if a live worker leads maintenance.",
    "archive_partitions": "Partitions of the archive table, the default one included.",
    "serve_long_polls_waiting": "Long polls this `courier serve` holds, waiting for a message.",
    "serve_long_polls_woken_total": "Long polls this `courier serve` woke on a NOTIFY (one per message, not per poll).",
}


class _Snapshot:
    """A collector that yields one family per metric name of a metrics() read."""

    def __init__(self, metrics: Sequence[CourierMetric]) -> None:
        self._by_name: dict[str, list[CourierMetric]] = defaultdict(list)
        for metric in metrics:
            self._by_name[metric.metric_name].append(metric)

    def collect(self) -> Iterator[Metric]:
        for name, samples in self._by_name.items():
            label_names = sorted({key for sample in samples for key in sample.labels})
            family_type = CounterMetricFamily if samples[0].metric_type == "counter" else GaugeMetricFamily
            family = family_type(PREFIX + name, HELP.get(name, name.replace("_", " ")), labels=label_names)
            for sample in samples:
                family.add_metric([str(sample.labels.get(key, "")) for key in label_names], sample.metric_value)
            yield family


def exposition(metrics: Sequence[CourierMetric]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics))
    return generate_latest(registry).decode()
