"""Snapshot tests: every pane drawn from the showcase data, at 80x24 and at 120x36, and every
dialog at 80x24, with its error showing where it can show one.

Update after a deliberate change with `pytest tests/test_console_snapshots.py --snapshot-update`,
then look at the new pictures (the report, or `python -m console.app.screenshots`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC

import pytest

from console.app import make_app, showcase
from console.app.screenshots import EXAMPLE_SECRET
from console.app.widgets.token_forms import NewToken, TokenSecretModal
from sqlkit.connection import connect
from tests.conftest import create_database, drop_database

PANES = ["overview", "endpoints", "messages", "dlq", "archive", "events", "workers", "analytics", "tokens",
         "schedules"]
SIZES = {"80x24": (80, 24), "120x36": (120, 36)}


@pytest.fixture(scope="module")
def showcase_dsn(server_dsn: str, template_name: str) -> Iterator[str]:
    name = "courier_show_" + uuid.uuid4().hex[:10]
    dsn = create_database(server_dsn, name, template=template_name)
    showcase.seed(dsn)
    yield dsn
    drop_database(server_dsn, name)


def showcase_app(dsn: str):
    return make_app(dsn, clock=showcase.fixed_clock, tz=UTC, refresh_scale=1000, database_label="showcase")


# Panes whose numbers come from two polls or more (the Overview's charts, every "delivered"
# rate): the showcase's recent past is played through them first, as the screenshots do.
HISTORY = {"overview": showcase.HISTORY_STEPS, "endpoints": 1}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("pane", PANES)
def test_pane(snap_compare, showcase_dsn, pane, size):
    async def before(pilot) -> None:
        await showcase.open_pane(pilot, pane)
        if pane in HISTORY:
            await showcase.play_history(pilot, showcase_dsn, HISTORY[pane])
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=SIZES[size], run_before=before)


def test_overview_at_once_at_80x24(snap_compare, showcase_dsn):
    """One poll so far: the charts are drawn from the maintenance leader's samples at once, with
    the gap where no leader sampled (a console need not have been watching)."""
    async def before(pilot) -> None:
        await showcase.open_pane(pilot, "overview")
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=(80, 24), run_before=before)


@pytest.mark.parametrize(("pane", "keys"), [
    ("overview", ("question_mark",)),
    ("dlq", ("enter",)),
    ("dlq", ("A",)),
    ("endpoints", ("n",)),
    ("archive", ("p",)),
])
def test_dialog(snap_compare, showcase_dsn, pane, keys):
    async def before(pilot) -> None:
        await showcase.open_pane(pilot, pane)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.5)
        await showcase.steady(pilot)
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=(100, 30), run_before=before)


def _set_values(pilot, values: dict[str, str]) -> None:
    from textual.widgets import Checkbox, Input, Select, TextArea

    for selector, value in values.items():
        widget = pilot.app.screen.query_one(selector)
        if isinstance(widget, Checkbox):
            widget.value = bool(value)
        elif isinstance(widget, TextArea):
            widget.text = value
        elif isinstance(widget, Select):
            widget.value = value
        else:
            assert isinstance(widget, Input)
            widget.value = value


def _error_shown(app, selector: str) -> bool:
    from textual.widgets import Static

    return bool(str(app.screen.query_one(selector, Static).render()))


def _toast_shown(app) -> bool:
    return bool(app.screen.query("Toast"))


async def _until(pilot, check, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# Every dialog of the console at 80x24, the smallest size it supports; each one that can show
# an error also with an error showing, produced for real (most of them by PostgreSQL refusing
# what was submitted). Entries: pane, keys that open the dialog, values to fill in, keys that
# submit, and where the answer appears (the dialog's error line, or a notification).
DIALOGS_80x24 = {
    "endpoint-create": ("endpoints", ("n",), {}, (), None),
    "endpoint-create-refused": ("endpoints", ("n",), {"#name": "orders",
                                                      "#config": '{"url": "http://127.0.0.1:9000/hook"}'},
                                ("ctrl+s",), "#form-error"),
    "endpoint-create-bad-json": ("endpoints", ("n",), {"#name": "orders", "#retry-policy": '{"max_retries": 5,'},
                                 ("ctrl+s",), "#form-error"),
    "retry-policy": ("endpoints", ("down", "p"), {}, (), None),
    "retry-policy-refused": ("endpoints", ("down", "p"),
                             {"#retry-policy": '{"max_retries": 5, "backoff": "sometimes"}'}, ("ctrl+s",),
                             "#form-error"),
    "topic-limits": ("endpoints", ("down",) * 5 + ("l",), {}, (), None),
    "topic-limits-bad-number": ("endpoints", ("down",) * 5 + ("l",), {"#max_depth": "lots"}, ("ctrl+s",),
                                "#form-error"),
    "topic-limits-refused": ("endpoints", ("down",) * 5 + ("l",), {"#max_retries": "5000"}, ("ctrl+s",),
                             "#form-error"),
    "token-create": ("tokens", ("n",), {}, (), None),
    "token-create-refused": ("tokens", ("n",), {"#name": "ci-deploy", "#topics": "orders, *",
                                                "#can-enqueue": "y", "#can-consume": "y"}, ("ctrl+s",), "#form-error"),
    "token-revoke": ("tokens", ("x",), {}, (), None),
    "schedule-detail": ("schedules", ("enter",), {}, (), None),
    "schedule-drop": ("schedules", ("x",), {}, (), None),
    "message-detail": ("messages", ("enter",), {}, (), None),
    "dlq-detail": ("dlq", ("enter",), {}, (), None),
    "dlq-redrive-one": ("dlq", ("R",), {}, (), None),
    "dlq-redrive-marked": ("dlq", ("space", "space", "S"), {}, (), None),
    "dlq-redrive-endpoint": ("dlq", ("E",), {}, (), None),
    "dlq-redrive-all": ("dlq", ("A",), {}, (), None),
    "archive-replay-wizard": ("archive", ("p",), {}, (), None),
    "archive-replay-dry-run": ("archive", ("p",), {"#replay-endpoint": "billing", "#replay-from": "2026-10-01",
                                                   "#replay-to": "2026-10-02"}, ("ctrl+d",), "#replay-count"),
    "archive-replay-bad-range": ("archive", ("p",), {"#replay-endpoint": "billing", "#replay-from": "2026-10-02",
                                                     "#replay-to": "2026-10-01"}, ("ctrl+d",), "#replay-error"),
    "archive-replay-confirm": ("archive", ("p",), {"#replay-endpoint": "billing", "#replay-from": "2026-10-01",
                                                   "#replay-to": "2026-10-02"}, ("ctrl+d", "ctrl+r"), "#question"),
    "help": ("overview", ("question_mark",), {}, (), None),
    "jump": ("overview", ("colon",), {}, (), None),
    "jump-unknown": ("overview", ("colon", "x", "y", "z"), {}, ("enter",), "toast"),
    "command-palette": ("overview", ("ctrl+p", "d", "l", "q"), {}, (), None),
}


@pytest.mark.parametrize("dialog", list(DIALOGS_80x24))
def test_dialog_at_80x24(snap_compare, showcase_dsn, dialog):
    pane, keys, values, submit, answer = DIALOGS_80x24[dialog]

    async def before(pilot) -> None:
        await showcase.open_pane(pilot, pane)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.1 if key == "down" else 0.5)
        _set_values(pilot, values)
        await pilot.pause(0.1)
        for key in submit:
            await pilot.press(key)
            if key == "ctrl+d":  # the dry run's count, before the replay can be confirmed
                await _until(pilot, lambda: "would be" in str(pilot.app.screen.query_one("#replay-count").render())
                             or _error_shown(pilot.app, "#replay-error"), "the dry run")
            await pilot.pause(0.3)
        if answer == "toast":
            await _until(pilot, lambda: _toast_shown(pilot.app), "the notification")
        elif answer:
            await _until(pilot, lambda: pilot.app.screen.query(answer) and _error_shown(pilot.app, answer),
                         f"{answer} to show")
        await showcase.steady(pilot)
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=(80, 24), run_before=before)


def test_token_secret_at_80x24(snap_compare, showcase_dsn):
    async def before(pilot) -> None:
        await showcase.open_pane(pilot, "tokens")
        pilot.app.push_screen(TokenSecretModal(NewToken("ci-deploy", EXAMPLE_SECRET)))
        await pilot.pause(0.3)
        await showcase.steady(pilot)
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=(80, 24), run_before=before)


@pytest.mark.parametrize("typed", ["", "0"])
def test_concurrency_prompt_at_80x24(snap_compare, showcase_dsn, typed):
    """The embedded pool's size (= on the Workers pane of a console started with --workers),
    and its answer to a size out of range."""
    from console.app.panes.workers import ConcurrencyPrompt

    async def before(pilot) -> None:
        await showcase.open_pane(pilot, "workers")
        pilot.app.push_screen(ConcurrencyPrompt(4))
        await pilot.pause(0.3)
        if typed:
            pilot.app.screen.query_one("#concurrency-input").value = typed
            await pilot.press("enter")
            await _until(pilot, lambda: _toast_shown(pilot.app), "the notification")
        await showcase.steady(pilot)
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=(80, 24), run_before=before)


# Errors that need the showcase changed behind the dialog's back: each in its own copy.
@pytest.fixture
def changing_showcase_dsn(server_dsn: str, template_name: str) -> Iterator[str]:
    name = "courier_show_" + uuid.uuid4().hex[:10]
    dsn = create_database(server_dsn, name, template=template_name)
    showcase.seed(dsn)
    yield dsn
    drop_database(server_dsn, name)


def test_dlq_redrive_refused_at_80x24(snap_compare, changing_showcase_dsn):
    """Another operator redrove the entry (the newest, under the cursor) while the confirmation was
    open: the refusal shows."""
    async def before(pilot) -> None:
        await showcase.open_pane(pilot, "dlq")
        await pilot.press("R")
        await _until(pilot, lambda: pilot.app.screen.query("#question"), "the confirmation")
        with connect(changing_showcase_dsn) as conn:
            conn.execute("SELECT courier.redrive_message(max(id)) FROM courier.dlq WHERE status = 'failed'")
        await pilot.press("y")
        await _until(pilot, lambda: _toast_shown(pilot.app), "the notification")
        await showcase.steady(pilot)
    assert snap_compare(showcase_app(changing_showcase_dsn), terminal_size=(80, 24), run_before=before)


def test_replay_dry_run_refused_at_80x24(snap_compare, changing_showcase_dsn):
    """The endpoint was dropped while the wizard was open: the dry run says so in the wizard."""
    async def before(pilot) -> None:
        await showcase.open_pane(pilot, "archive")
        await pilot.press("p")
        await _until(pilot, lambda: pilot.app.screen.query("#replay-endpoint"), "the wizard")
        _set_values(pilot, {"#replay-endpoint": "audit-noop"})
        with connect(changing_showcase_dsn) as conn:
            conn.execute("SELECT courier.drop_endpoint('audit-noop', true)")
        await pilot.press("ctrl+d")
        await _until(pilot, lambda: _error_shown(pilot.app, "#replay-error"), "the wizard's error")
        await showcase.steady(pilot)
    assert snap_compare(showcase_app(changing_showcase_dsn), terminal_size=(80, 24), run_before=before)


@pytest.mark.parametrize("pane", ["overview", "dlq"])
def test_light_theme(snap_compare, showcase_dsn, pane):
    async def before(pilot) -> None:
        pilot.app.theme = "textual-light"
        await showcase.open_pane(pilot, pane)
        if pane in HISTORY:
            await showcase.play_history(pilot, showcase_dsn, HISTORY[pane])
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=(100, 30), run_before=before)
