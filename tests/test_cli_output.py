"""What the CLI prints where it goes (issue 26): piped tables keep every value whole, --output
tsv|json|table (-o; --json is -o json) on every command that prints a table or a record, and
whole numbers printed as integers. Every command is a real `courier` subprocess against the
test's own database; its stdout is a pipe, as in `courier topic list | grep orders`."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from console.cli.context import tsv, tsv_cell
from console.literal import printable
from sqlkit import observability
from tests.helpers import report

COURIER = Path(sys.executable).parent / "courier"
LONG_TOPIC = "orders-" + "x" * 110
# Text an application may store: a tab, a newline, a backslash, a leading quote (which
# csv's default quoting would read as a quoted field), unicode, and characters that would
# act on a terminal.
AWKWARD = '"quoted" a\tb\nc \\n back\\slash é 漢字 🙂 \x1b[31mred \u202eevil'
ACTIVE = ["\x1b", "\r", "\u202e"]


def courier(dsn: str, *args: str, columns: int | None = 80) -> subprocess.CompletedProcess[str]:
    """`courier ARGS --dsn DSN` with stdout a pipe; COLUMNS as a terminal of that width would set."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PG") and k not in ("COURIER_DSN", "DATABASE_URL", "COLUMNS", "FORCE_COLOR")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([str(COURIER), *args, "--dsn", dsn], capture_output=True, text=True, env=env, timeout=60)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


_ESCAPE = re.compile(r"\\(\\|t|n|r|x[0-9a-f]{2}|u[0-9a-f]{4})")
_NAMED = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


def unescape(field: str) -> str:
    """A TSV field's text: \\\\, \\t, \\n, \\r, \\xNN and \\uNNNN read back (PostgreSQL's COPY text
    format reads the same escapes)."""
    return _ESCAPE.sub(lambda m: _NAMED.get(m[1]) or chr(int(m[1][1:], 16)), field)


def read_tsv(text: str) -> list[dict[str, str]]:
    """Rows of one TSV table, by header. csv's excel-tab dialect with QUOTE_NONE: every field is
    taken as written (a value starting with '"' is not a quoted field), then unescaped."""
    assert text.endswith("\n") and "\r" not in text
    header, *rows = list(csv.reader(text.splitlines(), dialect="excel-tab", quoting=csv.QUOTE_NONE))
    assert all(len(row) == len(header) for row in rows), "every row has the header's fields"
    return [{name: unescape(field) for name, field in zip(header, row, strict=True)} for row in rows]


def as_text(value: Any) -> str:
    """A JSON value as TSV spells it: empty for null, true/false, nested values as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def assert_tsv_is_the_json(dsn: str, *args: str) -> list[dict[str, str]]:
    """`ARGS -o tsv` holds the same records, fields and values as `ARGS --json`."""
    out = ok(courier(dsn, *args, "-o", "tsv"))
    for char in ACTIVE:
        assert char not in out, f"{char!r} reached stdout"
    rows = read_tsv(out)
    records = json.loads(ok(courier(dsn, *args, "--json")))
    assert [{k: as_text(v) for k, v in r.items()} for r in records] == rows
    return rows


@pytest.fixture
def awkward(conn: psycopg.Connection) -> psycopg.Connection:
    """A pull topic with a long name and limits, and a push endpoint, an event type and a dead
    letter each holding AWKWARD."""
    conn.execute("SELECT courier.create_endpoint(%s, 'pull', %s, '{}', %s)",
                 (LONG_TOPIC, json.dumps({"max_retries": 5, "max_depth": 100, "throughput_limit": 2.5}), AWKWARD))
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}', '{\"max_retries\": 0}', %s)", (AWKWARD,))
    conn.execute("SELECT courier.create_event_type('order.created', %s)", (AWKWARD,))
    conn.execute("SELECT courier.send_with_options('billing', %s::jsonb, p_ordering_key := %s)",
                 (json.dumps({"note": AWKWARD}), AWKWARD))
    endpoint_id = conn.execute("SELECT id FROM courier.endpoints WHERE name = 'billing'").fetchone()[0]
    ids = [r[0] for r in conn.execute("SELECT id FROM courier.claim_batch('t', 10, %s)", (endpoint_id,))]
    report(conn, ids, ["permanent"] * len(ids), [AWKWARD] * len(ids))
    conn.execute("SELECT courier.enqueue(%s, %s::jsonb, p_key := %s)",
                 (LONG_TOPIC, json.dumps({"note": "y" * 300}), "k\tey"))
    return conn


def test_piped_tables_print_every_value_whole(dsn, awkward):
    for columns in (80, None):  # a COLUMNS=80 terminal's setting, and none at all (rich's 80)
        listed = ok(courier(dsn, "topic", "list", columns=columns))
        assert LONG_TOPIC in listed and "…" not in listed and "\x1b" not in listed
        row = next(line for line in listed.splitlines() if LONG_TOPIC in line)
        assert re.search(r"│\s+5\s+│", row) and "2.5" in row, "the limits are on the topic's one line"
    dequeued = ok(courier(dsn, "dequeue", LONG_TOPIC))
    assert json.dumps({"note": "y" * 300}) in dequeued, "the payload is not cut at 60 characters"
    assert "k\\tey" in dequeued, "a tab in a cell is shown as \\t and does not split the cell"
    dlq = ok(courier(dsn, "dlq", "list"))
    assert printable(AWKWARD) in dlq and "…" not in dlq, "the last error is not cut at 36 characters"
    endpoints = ok(courier(dsn, "endpoint", "list"))
    assert printable(AWKWARD) in endpoints
    for char in ACTIVE:
        assert char not in dlq + endpoints + dequeued


def test_tsv_reads_back_to_the_same_values(dsn, awkward):
    topics = assert_tsv_is_the_json(dsn, "topic", "list")
    assert topics[0]["topic"] == LONG_TOPIC
    assert (topics[0]["max_retries"], topics[0]["max_depth"], topics[0]["throughput_limit"]) == ("5", "100", "2.5")
    endpoints = assert_tsv_is_the_json(dsn, "endpoint", "list")
    assert {e["name"]: e["description"] for e in endpoints} == {LONG_TOPIC: AWKWARD, "billing": AWKWARD}
    [entry] = assert_tsv_is_the_json(dsn, "dlq", "list")
    assert entry["last_error"] == AWKWARD and entry["endpoint_name"] == "billing"
    [event_type] = assert_tsv_is_the_json(dsn, "event-type", "list")
    assert event_type["description"] == AWKWARD
    assert_tsv_is_the_json(dsn, "endpoint", "health")
    assert_tsv_is_the_json(dsn, "dlq", "summary")
    assert_tsv_is_the_json(dsn, "config", "get")
    assert_tsv_is_the_json(dsn, "archive", "partitions")
    # A record: a header row and one row.
    [shown] = read_tsv(ok(courier(dsn, "endpoint", "show", "billing", "-o", "tsv")))
    assert shown["description"] == AWKWARD and shown["protocol"] == "noop"
    [taken] = read_tsv(ok(courier(dsn, "receive", LONG_TOPIC, "-o", "tsv")))
    assert taken["key"] == "k\tey" and json.loads(taken["payload"]) == {"note": "y" * 300}
    [created] = read_tsv(ok(courier(dsn, "topic", "create", "audit", "--max-depth", "7", "-o", "tsv")))
    assert json.loads(created["config"]) == {"max_depth": 7} and created["topic"] == "audit"


FORMULAS = ["=HYPERLINK(\"http://evil.example\",\"x\")", "+1+1", "-2+3", "@SUM(A1)"]


def test_csv_is_for_spreadsheets_and_never_runs_a_formula(dsn, conn):
    """Issue 40 (low): -o tsv writes stored text raw, so a spreadsheet would run a description
    such as =HYPERLINK(...). -o csv quotes as RFC 4180 and prefixes such text with an
    apostrophe; numbers (a negative one too) stay numbers."""
    for n, text in enumerate(FORMULAS):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}', %s, %s)",
                     (f"e{n}", json.dumps({"max_retries": 3}), text))
    conn.execute("SELECT courier.create_endpoint('awkward', 'noop', '{}', '{}', %s)", (AWKWARD,))
    out = ok(courier(dsn, "endpoint", "list", "-o", "csv"))
    for char in ACTIVE:
        assert char not in out, f"{char!r} reached stdout"
    rows = list(csv.DictReader(io.StringIO(out, newline="")))
    descriptions = {row["name"]: row["description"] for row in rows}
    assert [descriptions[f"e{n}"] for n in range(len(FORMULAS))] == ["'" + text for text in FORMULAS]
    assert descriptions["awkward"] == printable(AWKWARD, lines=True)  # tabs and newlines kept, quoted
    records = json.loads(ok(courier(dsn, "endpoint", "list", "--json")))
    assert len(rows) == len(records) and list(rows[0]) == list(records[0])
    helped = ok(courier(dsn, "endpoint", "list", "--help"))
    assert "csv" in helped and "formula" in helped


def test_tsv_prints_nothing_but_the_table(dsn):
    """No title, caption or note on stdout; an empty list is its header row alone."""
    assert ok(courier(dsn, "dlq", "list", "-o", "tsv")).splitlines() == [
        "id\toriginal_message_id\tendpoint_name\tstatus\tretry_count\tlast_error\tcorrelation_id\t"
        "original_created_at\tfailed_at\tredriven_at\tredriven_message_id"]
    for args in (("topic", "list"), ("endpoint", "list"), ("event-type", "list"), ("token", "list"),
                 ("dequeue", "nowhere"), ("metrics",)):
        if args == ("dequeue", "nowhere"):
            ok(courier(dsn, "topic", "create", "nowhere"))
        lines = ok(courier(dsn, *args, "-o", "tsv")).splitlines()
        assert lines and lines[0].split("\t")[0] in ("topic", "id", "name", "metric_name"), (args, lines)
        assert not any("│" in line or "(s)" in line for line in lines)
    events = ok(courier(dsn, "events", "-o", "tsv")).splitlines()
    assert events[0] == "id\tcreated_at\tevent_type\tendpoint\tactor\tdetails"
    assert [row["event_type"] for row in read_tsv("\n".join(events) + "\n")].count("endpoint.created") == 1


def test_status_tsv_is_one_table_per_section(dsn, awkward):
    """courier status: its own fields first, then endpoints, workers, health and late schedules,
    each a table with its header row, separated by an empty line; a table with no rows keeps its
    header."""
    sections = ok(courier(dsn, "status", "-o", "tsv")).split("\n\n")
    assert len(sections) == 5
    summary, endpoints, workers, health, late = (read_tsv(s if s.endswith("\n") else s + "\n") for s in sections)
    assert list(summary[0]) == ["queue_depth", "oldest_pending_age_seconds", "dlq_depth"]
    assert summary[0]["dlq_depth"] == "1" and json.loads(summary[0]["queue_depth"])["pending"] == 1
    assert {e["endpoint"] for e in endpoints} == {LONG_TOPIC, "billing"}
    assert workers == [] and sections[2].split("\t")[0] == "worker_id"
    assert {h["check_name"] for h in health} >= {"workers", "dlq", "schedules"}
    assert late == [] and sections[4].split("\t")[:2] == ["name", "endpoint_name"]


def test_json_prints_whole_numbers_as_integers(dsn, awkward):
    [topic] = [t for t in json.loads(ok(courier(dsn, "topic", "list", "--json"))) if t["topic"] == LONG_TOPIC]
    for key in ("max_retries", "max_depth", "message_ttl_seconds", "dlq_threshold", "visibility_timeout"):
        assert type(topic[key]) is int, (key, topic[key])
    assert (topic["max_depth"], topic["throughput_limit"]) == (100, 2.5)
    table = ok(courier(dsn, "topic", "list"))
    assert not re.search(r"\b\d+\.0\b", table)
    metrics = json.loads(ok(courier(dsn, "metrics", "--json")))
    depth = {m["labels"].get("status"): m["metric_value"] for m in metrics if m["metric_name"] == "queue_depth"}
    assert type(depth["failed"]) is int
    status = json.loads(ok(courier(dsn, "status", "--json")))
    assert all(type(h["value"]) in (int, float) for h in status["health"])
    assert not any(isinstance(h["value"], float) and h["value"].is_integer() for h in status["health"])


def test_output_json_is_the_json_alias(dsn, awkward):
    for args in (("topic", "list"), ("endpoint", "list"), ("endpoint", "show", "billing"), ("event-type", "list"),
                 ("config", "get", "max_queue_size"), ("dlq", "list"), ("db", "url")):
        assert ok(courier(dsn, *args, "-o", "json")) == ok(courier(dsn, *args, "--json")), args
        assert ok(courier(dsn, *args, "--output", "JSON")) == ok(courier(dsn, *args, "--json")), args
    # -o table is the default
    assert ok(courier(dsn, "topic", "list", "-o", "table")) == ok(courier(dsn, "topic", "list"))


def test_a_bad_output_is_a_usage_error(dsn):
    done = courier(dsn, "topic", "list", "-o", "xml")
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: Invalid value for '-o' / '--output': 'xml' is not one of 'table', 'tsv', 'csv', 'json'."]
    both = courier(dsn, "endpoint", "list", "--json", "-o", "tsv")
    assert both.returncode == 2 and "--json is --output json; it cannot be combined with --output tsv" in both.stderr


def test_a_tsv_field_is_one_line_that_reads_back_exactly():
    for value in (AWKWARD, "\\t is not a tab", "a\rb\x00c\x7f\x85\u2028", "", "plain"):
        field = tsv_cell(value)
        assert not set(field) & {"\t", "\n", "\r", "\x1b", "\u202e", "\x00"}
        assert unescape(field) == value
    assert [tsv_cell(v) for v in (None, True, 5, 2.5, {"a": "é"}, [1, 2])] == ["", "true", "5", "2.5",
                                                                              '{"a": "é"}', "[1, 2]"]
    from decimal import Decimal
    assert [tsv_cell(v) for v in (Decimal("5"), Decimal("5.0"), 5.0, Decimal("2.50"))] == ["5", "5", "5", "2.5"]
    empty = observability.QueueStatus(queue_depth={}, oldest_pending_age_seconds=0.0, dlq_depth=0, endpoints=[],
                                      workers=[], health=[])
    assert tsv(empty).count("\n\n") == 4, "an empty table keeps its header, so sections stay in place"
    check = observability.HealthCheck("workers", "warn", 1.0, "none\talive")
    assert tsv({"ok": False, "checks": [check]}) == ("ok\nfalse\n\ncheck_name\tstatus\tvalue\tdetail\n"
                                                    "workers\twarn\t1\tnone\\talive\n"), "courier doctor's shape"
