"""Issue 41: a headless worker says what fails. Delivery failures are WARNING lines, one per
endpoint per interval after the first (the counts and the last error, redacted); --log-level
and COURIER_LOG_LEVEL choose what is printed, and a bad level is one line and exit 2."""

from __future__ import annotations

import json
import logging
import os
import subprocess

from console.sink import WebhookSink
from console.workers.failure_log import FailureLog
from console.workers.outcome import Outcome, OutcomeKind
from tests.helpers import scalar
from tests.test_cli import COURIER
from tests.workers import start_worker_process, wait_for


def test_a_failing_endpoint_is_a_warning_with_its_error_and_no_secret(dsn, conn):
    # Nothing listens on port 9: every attempt fails to connect, retryable.
    conn.execute("SELECT courier.create_endpoint('billing', 'http', %s::jsonb, '{\"max_retries\": 50, "
                 "\"backoff\": \"fixed\", \"base_delay_seconds\": 1}')",
                 (json.dumps({"url": "http://user:hunter2secret@127.0.0.1:9/in", "allow_internal": True}),))
    for n in range(5):
        conn.execute("SELECT courier.send('billing', %s::jsonb)", (json.dumps({"n": n}),))
    worker = start_worker_process(dsn, "--log-level", "warning")
    try:
        wait_for(lambda: scalar(conn, "SELECT coalesce(sum(retry_count), 0) FROM courier.queue") >= 5, timeout=30)
    finally:
        worker.terminate()
        assert worker.wait(30) == 0
    lines = [json.loads(line) for line in worker.stderr.read().splitlines() if line.startswith("{")]
    failures = [line for line in lines if line["msg"] in ("delivery failed", "delivery failures")]
    assert failures and all(line["level"] == "warning" and line["endpoint"] == "billing" for line in failures)
    assert failures[0]["retryable"] >= 1 and failures[0]["last_error"]
    assert sum(line["retryable"] for line in failures) >= 5  # the stop logs what the interval held
    assert all(line["level"] != "info" for line in lines), "--log-level warning prints no info lines"
    assert "hunter2secret" not in json.dumps(lines)


def test_a_bad_log_level_is_one_line_and_exit_2(dsn):
    env = {**os.environ, "COURIER_LOG_LEVEL": "loud"}
    done = subprocess.run([str(COURIER), "worker", "--dsn", dsn], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 2 and "COURIER_LOG_LEVEL" in done.stderr and "Traceback" not in done.stderr


def test_failures_are_summed_per_endpoint_per_interval():
    now = [0.0]
    failures = FailureLog(interval=30, clock=lambda: now[0])
    logged: list[dict] = []
    import logging

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append({"msg": record.getMessage(), "endpoint": record.endpoint,
                           "retryable": record.retryable, "permanent": record.permanent})
    handler = Keep()
    logging.getLogger("courier.worker").addHandler(handler)
    try:
        failures.record("a", Outcome(OutcomeKind.RETRYABLE, "[RETRYABLE] HTTP 503"))  # logged at once
        for _ in range(9):
            now[0] += 1
            failures.record("a", Outcome(OutcomeKind.PERMANENT, "[PERMANENT] HTTP 400"))
        failures.record("b", Outcome(OutcomeKind.SUCCESS))
        assert [(x["msg"], x["retryable"], x["permanent"]) for x in logged] == [("delivery failed", 1, 0)]
        now[0] += 30
        failures.flush()
        assert logged[-1] == {"msg": "delivery failures", "endpoint": "a", "retryable": 0, "permanent": 9}
        failures.flush(all_of_them=True)  # nothing more to say
        assert len(logged) == 2
    finally:
        logging.getLogger("courier.worker").removeHandler(handler)


def test_the_leader_logs_each_circuit_that_opens_and_closes(dsn, conn):
    """A circuit that opens is a WARNING line from the maintenance leader, once, whichever
    worker's report opened it; its closing an info line."""
    conn.execute("SELECT courier.create_endpoint('inventory', 'http', %s::jsonb, '{\"max_retries\": 50, "
                 "\"backoff\": \"fixed\", \"base_delay_seconds\": 1}')",
                 (json.dumps({"url": "http://127.0.0.1:9/in", "allow_internal": True}),))
    for n in range(20):
        conn.execute("SELECT courier.send('inventory', %s::jsonb)", (json.dumps({"n": n}),))
    worker = start_worker_process(dsn)
    try:
        wait_for(lambda: scalar(conn, "SELECT circuit_state FROM courier.endpoints") == "open", timeout=60)
        wait_for(lambda: "\"circuit opened\"" in worker.stderr.so_far(), timeout=15)
    finally:
        worker.terminate()
        assert worker.wait(30) == 0
    lines = [json.loads(line) for line in worker.stderr.read().splitlines() if line.startswith("{")]
    opened = [line for line in lines if line["msg"] == "circuit opened"]
    assert len(opened) == 1 and opened[0]["level"] == "warning" and opened[0]["endpoint"] == "inventory"


def test_each_kind_is_counted_as_the_dispatcher_classed_it():
    """A 410's DISABLE is neither retryable nor permanent: the line counts it as disable, and
    every line names each kind's count, zeros included."""
    now = [0.0]
    failures = FailureLog(interval=30, clock=lambda: now[0])
    logged: list[dict] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append({"msg": record.getMessage(), "retryable": record.retryable,
                           "permanent": record.permanent, "disable": record.disable,
                           "last_error": record.last_error})
    handler = Keep()
    logging.getLogger("courier.worker").addHandler(handler)
    try:
        failures.record("gone", Outcome.disable("HTTP 410 Gone"))  # logged at once
        assert logged == [{"msg": "delivery failed", "retryable": 0, "permanent": 0, "disable": 1,
                           "last_error": "[DISABLE] HTTP 410 Gone"}]
        for outcome in (Outcome.disable("HTTP 410 Gone"), Outcome.retryable("HTTP 503"), Outcome.permanent("HTTP 400"),
                        Outcome.snooze(503, 5), Outcome.disable("HTTP 410 Gone")):
            now[0] += 1
            failures.record("gone", outcome)
        failures.flush(all_of_them=True)
        assert logged[-1] == {"msg": "delivery failures", "retryable": 1, "permanent": 1, "disable": 2,
                              "last_error": "[DISABLE] HTTP 410 Gone"}
    finally:
        logging.getLogger("courier.worker").removeHandler(handler)


def test_a_gone_endpoint_is_logged_as_disable_not_retryable(dsn, conn):
    """End to end: a worker delivering to an endpoint that answers 410 Gone logs its failures
    under disable, and none as retryable."""
    with WebhookSink() as sink:
        conn.execute("SELECT courier.create_endpoint('gone', 'http', %s::jsonb)",
                     (json.dumps({"url": f"{sink.url}/status/410", "allow_internal": True}),))
        for n in range(3):
            conn.execute("SELECT courier.send('gone', %s::jsonb)", (json.dumps({"n": n}),))
        worker = start_worker_process(dsn, "--log-level", "warning")
        try:
            wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.dlq") == 3, timeout=30)
        finally:
            worker.terminate()
            assert worker.wait(30) == 0
    lines = [json.loads(line) for line in worker.stderr.read().splitlines() if line.startswith("{")]
    failures = [line for line in lines if line["msg"] in ("delivery failed", "delivery failures")]
    assert failures and all(line["endpoint"] == "gone" for line in failures)
    assert sum(line["disable"] for line in failures) == 3
    assert sum(line["retryable"] + line["permanent"] for line in failures) == 0
    assert failures[-1]["last_error"] == "[DISABLE] HTTP 410 Gone"
