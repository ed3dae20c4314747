"""Snapshot tests: every pane drawn from the showcase data, at 80x24 and at 120x36.

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
from tests.conftest import create_database, drop_database

PANES = ["overview", "endpoints", "messages", "dlq", "archive", "events", "workers", "analytics", "tokens"]
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


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("pane", PANES)
def test_pane(snap_compare, showcase_dsn, pane, size):
    async def before(pilot) -> None:
        await showcase.open_pane(pilot, pane)
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=SIZES[size], run_before=before)


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


async def _type_into(pilot, values: dict[str, str]) -> None:
    from textual.widgets import Checkbox, Input

    for selector, value in values.items():
        widget = pilot.app.screen.query_one(selector)
        if isinstance(widget, Checkbox):
            widget.value = bool(value)
        else:
            assert isinstance(widget, Input)
            widget.value = value


async def _submit_and_wait_for_error(pilot) -> None:
    from textual.widgets import Static

    await pilot.press("ctrl+s")
    for _ in range(100):
        await pilot.pause(0.05)
        if str(pilot.app.screen.query_one("#form-error", Static).render()):
            break
    await showcase.steady(pilot)


# The dialogs of issue 25, at the smallest size the console supports, each with its error showing.
DIALOGS_80x24 = {
    "topic-limits": ("endpoints", ("down",) * 5 + ("l",), {}),
    "topic-limits-bad-number": ("endpoints", ("down",) * 5 + ("l",), {"#max_depth": "lots"}),
    "topic-limits-refused": ("endpoints", ("down",) * 5 + ("l",), {"#max_retries": "5000"}),
    "token-create": ("tokens", ("n",), {}),
    "token-create-refused": ("tokens", ("n",), {"#name": "ci-deploy", "#topics": "orders, *",
                                                "#can-enqueue": "y", "#can-consume": "y"}),
}


@pytest.mark.parametrize("dialog", list(DIALOGS_80x24))
def test_dialog_at_80x24(snap_compare, showcase_dsn, dialog):
    pane, keys, values = DIALOGS_80x24[dialog]

    async def before(pilot) -> None:
        await showcase.open_pane(pilot, pane)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.1 if key == "down" else 0.5)
        if values:
            await _type_into(pilot, values)
        if dialog.endswith(("-refused", "-bad-number")):
            await _submit_and_wait_for_error(pilot)
        await showcase.steady(pilot)
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=(80, 24), run_before=before)


def test_token_secret_at_80x24(snap_compare, showcase_dsn):
    async def before(pilot) -> None:
        await showcase.open_pane(pilot, "tokens")
        pilot.app.push_screen(TokenSecretModal(NewToken("ci-deploy", EXAMPLE_SECRET)))
        await pilot.pause(0.3)
        await showcase.steady(pilot)
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=(80, 24), run_before=before)


@pytest.mark.parametrize("pane", ["overview", "dlq"])
def test_light_theme(snap_compare, showcase_dsn, pane):
    async def before(pilot) -> None:
        pilot.app.theme = "textual-light"
        await showcase.open_pane(pilot, pane)
    assert snap_compare(showcase_app(showcase_dsn), terminal_size=(100, 30), run_before=before)
