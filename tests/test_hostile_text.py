"""Text an application stores is shown as it is, never obeyed: a corpus of hostile strings
(markup, escape sequences, control, bidi and zero-width characters, a megabyte line, bytes
that are not UTF-8) pushed through every CLI table and every console pane. Nothing crashes,
the markup is printed as written, and nothing reaches the terminal that would act on it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
from rich.console import Console
from textual.widgets import DataTable, Static

from console.app import make_app
from console.cli.context import emit
from console.literal import printable
from sqlkit import tokens
from tests.console_driver import open_pane
from tests.helpers import report

COURIER = Path(sys.executable).parent / "courier"

CORPUS = {
    "markup-close": "see [/docs] for details",
    "markup-style": "[bold red]alarm[/]",
    "markup-bare-close": "cust-[/1]",
    "textual-action": "[@click=app.quit]quit[/]",
    "markup-link": "[link=https://evil.example]x[/link]",
    "emoji-code": ":skull: :smile:",
    "json-like": "[1, 2]",
    "ansi-colour": "\x1b[31mred\x1b[0m",
    "ansi-clear": "\x1b[2J\x1b[H",
    "osc-title": "\x1b]0;pwned\x07",
    "carriage-return": "safe\rEVIL",
    "backspace": "ab\x08\x08XY",
    "del-and-c1": "x\x7fy\x85z\x9b",
    "rtl-scripts": "שלום مرحبا",
    "bidi-override": "\u202eevil\u202c",
    "bidi-isolate": "\u2066iso\u2069",
    "zero-width": "a\u200bb\u200dc\ufeffd",
    "line-separator": "a\u2028b",
    "wide": "🙂漢字",
    "combining": "e\u0301",
    "newline-tab": "line1\nline2\tTab",
}
# What must never reach a terminal from stored text.
ACTIVE = ["\x1b", "\r", "\x07", "\x08", "\x7f", "\x85", "\x9b", "\u202e", "\u202c", "\u2066", "\u2069", "\u2028"]
MEGABYTE = "x" * 1_000_000


def probe(value: str) -> str:
    """The part of a value a table cell must show: its first line, escaped as displayed."""
    return printable(value.split("\n")[0].split("\t")[0])


def _courier(dsn: str, *args: str, columns: int = 1000) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k not in ("COURIER_DSN", "DATABASE_URL")}
    env["COLUMNS"] = str(columns)
    return subprocess.run([str(COURIER), *args, "--dsn", dsn], capture_output=True, text=True, env=env, timeout=120)


def _dead_letter_pull(conn: psycopg.Connection, topic: str, payload: Any, key: str | None, error: str) -> None:
    conn.execute("SELECT courier.enqueue(%s, %s::jsonb, p_key := %s)", (topic, json.dumps(payload), key))
    row = conn.execute("SELECT id, lease FROM courier.dequeue(%s, 1)", (topic,)).fetchone()
    conn.execute("SELECT courier.nack(%s::bigint, %s, %s)", (row[0], row[1], error))


@pytest.fixture
def hostile(conn: psycopg.Connection) -> psycopg.Connection:
    """Every corpus value in every place an application or a worker can put text."""
    values = list(CORPUS.values())
    conn.execute("SELECT courier.create_endpoint('hostile', 'noop', '{}', '{\"max_retries\": 5}', %s)",
                 (" ".join(values),))
    conn.execute("SELECT courier.create_endpoint('inbox', 'pull', '{\"max_retries\": 0}')")
    conn.execute("SELECT courier.create_endpoint('held', 'pull', '{}')")
    conn.execute("SELECT courier.create_endpoint('taken', 'pull', '{}')")
    conn.execute("SELECT courier.create_event_type('hostile.event', %s)", (" ".join(values),))
    for name, value in CORPUS.items():
        payload = {"note": value, "flags": [1, 2], "name": name}
        # HTTP forbids control characters in a header (line breaks, ESC, DEL...; tab aside): refused at send.
        headers = {} if re.search("[\x00-\x08\x0a-\x1f\x7f]", value) else {"X-Note": value}
        conn.execute("SELECT courier.send_with_options('hostile', %s::jsonb, p_ordering_key := %s, "
                     "p_headers := %s::jsonb)", (json.dumps(payload), value, json.dumps(headers)))
        _dead_letter_pull(conn, "inbox", payload, value, value)
        for topic in ("held", "taken"):
            conn.execute("SELECT courier.enqueue(%s, %s::jsonb, p_key := %s)", (topic, json.dumps(payload), value))
        conn.execute("SELECT courier._log_event('hostile', NULL, %s::jsonb)", (json.dumps({"note": value}),))
        conn.execute("SELECT courier.worker_heartbeat(%s, %s, 1, 1, 0, 0, 0, 'running')", (value, value))
    # The worker's path: a failed attempt's error stays on the pending message.
    endpoint_id = conn.execute("SELECT id FROM courier.endpoints WHERE name = 'hostile'").fetchone()[0]
    ids = [r[0] for r in conn.execute("SELECT id FROM courier.claim_batch('t', 100, %s)", (endpoint_id,))]
    report(conn, ids, ["retryable"] * len(ids), values[: len(ids)])
    # One dead letter holding everything at once, and one holding a megabyte.
    _dead_letter_pull(conn, "inbox", dict(CORPUS), None, " | ".join(values))
    _dead_letter_pull(conn, "inbox", {"big": MEGABYTE}, None, MEGABYTE)
    conn.execute("SELECT courier.enqueue('inbox', NULL, p_payload_binary := %s)", (b"\xff\xfe\x00not utf-8\xc3",))
    # A token's name is checked, but its scope is whatever topic and endpoint names were typed.
    for n, value in enumerate(values):
        tokens.create_token(conn, f"hostile-{n}", topics=[value], endpoints=[value], actions=["consume"])
    # A schedule's name is checked too; its description is typed, and its last error is what a
    # send refused with (quoting what it was given): late, so `courier status` lists them.
    for n, value in enumerate(values):
        conn.execute("SELECT courier.create_schedule(%s, '* * * * *', 'hostile', p_description => %s)",
                     (f"hostile-{n}", value))
        conn.execute("UPDATE courier.schedules SET last_error = %s, last_error_at = now(), "
                     "next_run_at = now() - interval '10 minutes' WHERE name = %s", (value, f"hostile-{n}"))
    return conn


def _assert_shown_literally(out: str, values: list[str]) -> None:
    for char in ACTIVE:
        assert char not in out, f"{char!r} reached the terminal"
    for value in values:
        assert probe(value) in out, f"{value!r} is not shown as {probe(value)!r}"


def test_cli_tables_show_stored_text_literally(dsn, hostile):
    values = list(CORPUS.values())
    everything = hostile.execute("SELECT id FROM courier.dlq WHERE payload ? 'markup-close'").fetchone()[0]
    big = hostile.execute("SELECT id FROM courier.dlq WHERE payload ? 'big'").fetchone()[0]
    surfaces = {
        ("dlq", "list", "--limit", "100"): values,
        ("dlq", "show", str(everything)): values,
        ("dlq", "summary"): [],
        ("endpoint", "list"): [],
        ("endpoint", "show", "hostile"): [],
        ("event-type", "list"): [],
        ("events", "--limit", "100"): [json.dumps(v)[1:-1] for v in values],
        ("status",): [],
        ("topic", "list"): [],
        ("peek", "inbox"): [],
        ("dequeue", "held", "--count", "100"): values,  # as keys
        ("receive", "taken", "--count", "100"): values,
        ("schedule", "list"): [],
        ("schedule", "show", "hostile-0"): [],
        ("archive", "list", "--limit", "100"): [],  # the dead-lettered messages, with their errors
    }
    for args, shown in surfaces.items():
        done = _courier(dsn, *args)
        assert done.returncode == 0, f"courier {' '.join(args)}: {done.stderr}"
        assert "Traceback" not in done.stderr and "warning" not in done.stderr, done.stderr
        _assert_shown_literally(done.stdout, shown)
    # Descriptions and worker ids hold the whole corpus (wrapped in narrow columns): none is obeyed.
    for args in (("endpoint", "show", "hostile"), ("event-type", "list"), ("status",)):
        _assert_shown_literally(_courier(dsn, *args).stdout, ["alarm[/]", "[@click=app.quit]quit[/]"])
    # A megabyte of error text and payload, and bytes that are not UTF-8, in an 80-column terminal.
    for args in (("dlq", "show", str(big)), ("dlq", "list"), ("receive", "inbox", "--count", "5")):
        done = _courier(dsn, *args, columns=80)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "bytes>" in done.stdout


def test_what_receive_and_dequeue_took_is_printed_whatever_it_holds(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    conn.execute("""SELECT courier.enqueue('orders', '{"note": "see [/docs] for details", "flags": [1, 2]}',
                                          p_key := 'cust-[/1]')""")
    conn.execute("""SELECT courier.enqueue('orders', '{"note": "[bold]x[/] \\u001b[2J"}')""")
    dequeued = _courier(dsn, "dequeue", "orders", columns=80)
    assert dequeued.returncode == 0, dequeued.stderr
    text = " ".join(dequeued.stdout.split())
    assert "cust-[/1]" in text and "[/docs]" in text and '"flags": [1, 2]' in text
    lease = conn.execute("SELECT lease FROM courier.queue WHERE key = 'cust-[/1]'").fetchone()[0]
    assert re.search(rf"│ 1 +│ {lease} +│", dequeued.stdout), "the id and lease to ack with are shown"
    received = _courier(dsn, "receive", "orders", columns=80)
    assert received.returncode == 0, received.stderr
    assert "[bold]x[/]" in received.stdout and "\x1b" not in received.stdout
    assert "\\u001b[2J" in received.stdout


def test_a_table_that_will_not_draw_still_prints_what_was_taken(capsys):
    def render() -> None:
        raise ValueError("a value no table can draw")

    with click.Context(click.Command("receive")):
        emit([{"id": 7, "payload": {"note": "kept"}}], render)
    out, err = capsys.readouterr()
    assert json.loads(out) == [{"id": 7, "payload": {"note": "kept"}}]
    assert "could not draw the table (ValueError: a value no table can draw); printed as JSON instead" in err


def _table_text(app) -> str:
    table = app.pane.query_one(DataTable)
    return "\n".join(" ".join(cell.plain if hasattr(cell, "plain") else str(cell) for cell in table.get_row(key))
                     for key in table.rows)


def _rendered(widget: Static) -> str:
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(widget.content)
    return console.export_text()


def test_every_console_pane_shows_stored_text_literally(dsn, hostile):
    values = list(CORPUS.values())
    everything = hostile.execute("SELECT id FROM courier.dlq WHERE payload ? 'markup-close'").fetchone()[0]
    big = hostile.execute("SELECT id FROM courier.dlq WHERE payload ? 'big'").fetchone()[0]
    message = hostile.execute("SELECT id FROM courier.queue WHERE ordering_key = '[@click=app.quit]quit[/]'"
                              ).fetchone()[0]
    app = make_app(dsn)

    async def scenario() -> None:
        async with app.run_test(size=(160, 50)) as pilot:
            for pane in ("overview", "endpoints", "messages", "dlq", "events", "workers", "archive", "analytics",
                         "tokens", "schedules"):
                await open_pane(pilot, pane)
                if pane in ("messages", "dlq", "workers", "tokens", "schedules"):
                    shown = _table_text(app)
                    for char in ACTIVE:
                        assert char not in shown
                    for value in values:
                        # a one-line preview (an error) may fold whitespace, \r included
                        forms = {probe(value)[:30], probe(" ".join(value.split()))[:30]}
                        assert any(form in shown for form in forms), f"{pane}: {value!r}"
            await open_pane(pilot, "messages")
            app.pane.open_message(message)
            await pilot.pause(0.5)
            fields = _rendered(app.screen.query_one("#detail-fields", Static))
            assert "[@click=app.quit]quit[/]" in fields
            headers = _rendered(app.screen.query_one("#detail-headers", Static))
            assert "[@click=app.quit]quit[/]" in headers
            await pilot.press("escape")
            await open_pane(pilot, "dlq")
            for dlq_id in (everything, big):
                app.pane.open_entry(dlq_id)
                await pilot.pause(1.0)
                payload = _rendered(app.screen.query_one("#detail-payload", Static))
                history = _rendered(app.screen.query_one("#detail-history", Static))
                for char in ACTIVE:
                    assert char not in payload + history
                if dlq_id == everything:
                    assert "[bold red]alarm[/]" in payload and "\\u202eevil" in payload
                    assert "see [/docs] for details" in " ".join(history.split())
                else:
                    assert "more characters not shown" in payload
                await pilot.press("escape")
            await open_pane(pilot, "schedules")
            table = app.pane.query_one(DataTable)
            for name in ("hostile-0", "hostile-3"):  # see [/docs] ...; [@click=app.quit]quit[/]
                table.move_cursor(row=table.get_row_index(name))
                app.pane.action_open()
                await pilot.pause(0.5)
                fields = _rendered(app.screen.query_one("#detail-fields", Static))
                for char in ACTIVE:
                    assert char not in fields
                assert fields.count(values[int(name[-1])]) == 2  # the last error and the description, whole
                await pilot.press("escape")
            assert app.is_running, "the console is still up"

    asyncio.run(scenario())


def test_token_list_shows_hostile_scopes_literally(dsn, conn):
    """A token's topics and endpoints are the admin's own text; `courier token list` shows them
    and never obeys them."""
    values = list(CORPUS.values())
    for n, value in enumerate(values):
        tokens.create_token(conn, f"t{n}", topics=[value], endpoints=[value], actions=["consume"])
    done = _courier(dsn, "token", "list")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    _assert_shown_literally(done.stdout, values)


def test_courier_sink_prints_what_it_receives_literally():
    """`courier sink` shows a request's path, message-id header and body as sent: the corpus
    in a body never acts on the terminal and its markup is printed as written."""
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    sink = subprocess.Popen([str(COURIER), "sink", "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "1000"})
    body = json.dumps(CORPUS, ensure_ascii=False).encode()
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/hook", data=body, method="POST",
                                                 headers={"x-courier-message-id": "[bold]7\x1b[2J"})
                urllib.request.urlopen(request, timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline and sink.poll() is None, sink.stderr.read()
                time.sleep(0.1)
    finally:
        sink.send_signal(signal.SIGINT)
        out, err = sink.communicate(timeout=30)
    assert sink.returncode in (0, 130) and "Traceback" not in err
    assert not [char for char in ACTIVE if char in out]
    assert "message [bold]7\\x1b[2J" in out and "[@click=app.quit]quit[/]" in out and "\\u202eevil" in out
