"""Listings that stop at --limit say so (issue 41, item 3): `courier dlq list` and `courier
events` print a note on stderr when rows matching the filters were left out, in every output
format, with the --after ID that prints the next page; --json keeps its shape and --envelope
carries the same facts in the JSON; --all prints everything; pages by id stay put while new
rows arrive. Every command is a real `courier` subprocess against the test's own database."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqlkit import dlq, queries
from tests.console_driver import dead_letter
from tests.test_console_queries import deep_dlq, explain_params  # noqa: F401  (deep_dlq: a fixture)

COURIER = Path(sys.executable).parent / "courier"
ENV = {k: v for k, v in os.environ.items()
       if not k.startswith("PG") and k not in ("COURIER_DSN", "DATABASE_URL", "FORCE_COLOR")}


def courier(dsn: str, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(COURIER), *args, "--dsn", dsn], capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def note(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("note:")]


@pytest.fixture
def dead(conn: psycopg.Connection) -> dict[str, list[int]]:
    """60 dead letters of endpoint a (more than a page of 50) and 5 of b; their ids, newest first."""
    for name in ("a", "b"):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    return {"a": dead_letter(conn, "a", 60)[::-1], "b": dead_letter(conn, "b", 5)[::-1]}


def test_dlq_list_says_it_stopped_early_in_every_format(dsn, dead):
    a = dead["a"]
    table = courier(dsn, "dlq", "list", "--endpoint", "a")
    assert "first 50 DLQ entries (more follow)" in table.stdout
    assert "50 DLQ entries\n" not in table.stdout  # no total it does not know
    expected = [f"note: stopped after 50 DLQ entries; more follow. Next page: --after {a[49]}; all the rest: "
                f"--all --after {a[49]}; or a larger --limit."]
    assert note(table) == expected
    listed = courier(dsn, "dlq", "list", "--endpoint", "a", "--json")
    assert [e["id"] for e in json.loads(listed.stdout)] == a[:50]  # the bare list, as before
    assert note(listed) == expected
    tsv = courier(dsn, "dlq", "list", "--endpoint", "a", "-o", "tsv")
    assert len(tsv.stdout.splitlines()) == 51 and note(tsv) == expected
    rows = list(csv.reader(io.StringIO(courier(dsn, "dlq", "list", "--endpoint", "a", "-o", "csv").stdout)))
    assert [int(r[0]) for r in rows[1:]] == a[:50]
    wrapped = json.loads(courier(dsn, "dlq", "list", "--endpoint", "a", "--json", "--envelope").stdout)
    assert [e["id"] for e in wrapped["items"]] == a[:50]
    assert (wrapped["count"], wrapped["more"], wrapped["next_after"]) == (50, True, a[49])


def test_dlq_list_that_printed_everything_says_nothing(dsn, dead):
    exactly = courier(dsn, "dlq", "list", "--endpoint", "a", "--limit", "60")
    assert "60 DLQ entries" in exactly.stdout and "more follow" not in exactly.stdout and note(exactly) == []
    everything = courier(dsn, "dlq", "list", "--all", "--json", "--envelope")
    wrapped = json.loads(everything.stdout)
    assert [e["id"] for e in wrapped["items"]] == sorted(dead["a"] + dead["b"], reverse=True)
    assert (wrapped["count"], wrapped["more"], wrapped["next_after"]) == (65, False, None)
    assert note(everything) == []
    assert "65 DLQ entries" in courier(dsn, "dlq", "list", "--all").stdout


@pytest.mark.parametrize("filters", [(), ("--endpoint", "a"), ("--status", "failed"),
                                     ("--endpoint", "a", "--status", "failed")])
def test_dlq_pages_by_after_stay_put_while_entries_arrive(dsn, conn, dead, filters):
    """Each of the three listing queries, paged by --after with new entries arriving between
    pages: every entry that was there at the start is printed once, in order."""
    at_start = sorted(dead["a"] + ([] if "a" in filters else dead["b"]), reverse=True)
    seen: list[int] = []
    after: list[str] = []
    while True:
        page = json.loads(courier(dsn, "dlq", "list", *filters, "--limit", "20", *after, "--json",
                                  "--envelope").stdout)
        seen += [e["id"] for e in page["items"]]
        if not page["more"]:
            break
        assert page["next_after"] == page["items"][-1]["id"]
        after = ["--after", str(page["next_after"])]
        dead_letter(conn, "a", 3)  # newer than every page: they must not shift the next one
    assert seen == at_start


def test_dlq_paged_queries_come_from_indexes(deep_dlq, monkeypatch):  # noqa: F811
    """--after is an index condition: a deep page reads from the index, not the whole DLQ."""
    ran: list[tuple[str, dict[str, Any]]] = []
    real = queries.fetch_all
    monkeypatch.setattr(queries, "fetch_all", lambda c, name, params=None: ran.append((name, params)) or real(
        c, name, params))
    for endpoint in (None, "other", "webhook"):
        for status in (None, "failed", "redriven"):
            for after in (None, 50_000, 110_000):
                ran.clear()
                got = [e.id for e in dlq.list_entries(deep_dlq, endpoint, status, 50, after)]
                ((name, params),) = ran
                nodes = explain_params(deep_dlq, queries.query(name), params)
                on_dlq = [n for n in nodes if n.get("Relation Name") == "dlq"]
                assert on_dlq and not [n for n in on_dlq if n["Node Type"] == "Seq Scan"], (endpoint, status, after)
                if endpoint or status == "failed":  # (a bitmap scan names its index on its child node)
                    used = {n["Index Name"] for n in nodes if "Index Name" in n}
                    assert used and used <= {"dlq_endpoint_idx", "dlq_failed_idx"}, (endpoint, status, after, used)
                expected = [row[0] for row in deep_dlq.execute(
                    "SELECT id FROM courier.dlq WHERE (%(e)s::text IS NULL OR endpoint_name = %(e)s::text) "
                    "AND (%(s)s::text IS NULL OR status = %(s)s::text) AND (%(a)s::bigint IS NULL OR id < %(a)s) "
                    "ORDER BY id DESC LIMIT 50", {"e": endpoint, "s": status, "a": after})]
                assert got == expected, (endpoint, status, after)


@pytest.fixture
def logged(conn: psycopg.Connection) -> list[int]:
    """About 80 events (an endpoint created, disabled and enabled 40 times); their ids, oldest first."""
    conn.execute("SELECT courier.create_endpoint('b', 'noop', '{}')")
    for _ in range(40):
        conn.execute("SELECT courier.disable_endpoint('b')")
        conn.execute("SELECT courier.enable_endpoint('b')")
    return [row[0] for row in conn.execute("SELECT id FROM courier.event_log ORDER BY id")]


def test_events_say_older_ones_were_left_out(dsn, logged):
    older = ["note: showing the newest 50 events; older ones were left out. Every one: --all; a page at a time "
             "from the oldest: --after 0; or a larger --limit."]
    for output in ("table", "json", "tsv", "csv"):
        done = courier(dsn, "events", "-o", output)
        assert note(done) == older, output
    lines = courier(dsn, "events", "--json").stdout.splitlines()
    assert [json.loads(line)["id"] for line in lines] == logged[-50:]  # JSON lines, as before
    wrapped = json.loads(courier(dsn, "events", "--json", "--envelope").stdout)
    assert [e["id"] for e in wrapped["items"]] == logged[-50:]
    assert (wrapped["count"], wrapped["more"], wrapped["next_after"]) == (50, True, None)
    assert note(courier(dsn, "events", "--limit", str(len(logged)))) == []


def test_events_page_after_an_id_and_all(dsn, conn, logged):
    first = courier(dsn, "events", "--after", "0", "--limit", "30", "--json")
    assert [json.loads(line)["id"] for line in first.stdout.splitlines()] == logged[:30]
    assert note(first) == [f"note: stopped after 30 events; more follow. Next page: --after {logged[29]}; all the "
                           f"rest: --all --after {logged[29]}; or a larger --limit."]
    conn.execute("SELECT courier.disable_endpoint('b')")  # a new event: the next page is still the next 30
    second = json.loads(courier(dsn, "events", "--after", str(logged[29]), "--limit", "30", "--json",
                                "--envelope").stdout)
    assert [e["id"] for e in second["items"]] == logged[30:60] and second["next_after"] == logged[59]
    everything = courier(dsn, "events", "--all", "-o", "tsv")
    assert [int(line.split("\t")[0]) for line in everything.stdout.splitlines()[1:]][:len(logged)] == logged
    assert note(everything) == []
    rest = json.loads(courier(dsn, "events", "--all", "--after", str(logged[59]), "--json", "--envelope").stdout)
    assert [e["id"] for e in rest["items"]][:len(logged) - 60] == logged[60:]
    assert (rest["more"], rest["next_after"]) == (False, None)


def test_paging_options_that_contradict_each_other_are_usage_errors(dsn):
    for args, said in ((("dlq", "list", "--all", "--limit", "5"), "--all prints every row"),
                       (("dlq", "list", "--envelope"), "--envelope shapes JSON output"),
                       (("events", "--json", "--envelope", "--follow"), "cannot be combined with --follow"),
                       (("events", "--all", "--limit", "3"), "--all prints every row")):
        done = courier(dsn, *args, code=2)
        assert said in done.stderr and done.stdout == "", args
    helped = courier(dsn, "dlq", "list", "--help").stdout
    assert "--after ID" in helped and "--envelope" in helped and "next_after" in helped
