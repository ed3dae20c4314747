"""The cursor and the marks follow the row they were put on (by key), while a live table's
refresh inserts rows above it or removes rows around it: an action hits the chosen row."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from rich.text import Text
from textual.app import App, ComposeResult

from console.app.widgets.live_table import LiveTable
from tests.console_driver import dead_letter, open_pane, run_console, wait_for
from tests.helpers import scalar


@pytest.fixture
def alpha(conn: psycopg.Connection) -> str:
    conn.execute("SELECT courier.create_endpoint('alpha', 'noop', '{}')")
    return "alpha"


def shown(table: LiveTable, key: str) -> bool:
    try:
        table.get_row_index(key)
    except Exception:
        return False
    return True


def marked_rows(table: LiveTable) -> set[int]:
    """The ids whose mark cell shows a mark, as the operator sees them."""
    return {int(row_key.value) for row_key in table.rows
            if isinstance(mark := table.get_cell(row_key, "mark"), Text) and mark.plain}


async def confirm(pilot, expected_text: str) -> None:
    await wait_for(pilot, lambda: type(pilot.app.screen).__name__ == "ConfirmModal", what="the confirmation")
    assert expected_text in pilot.app.screen.question
    await pilot.press("y")


def test_dlq_cursor_stays_on_its_entry_while_new_entries_arrive(dsn, conn, alpha):
    old = dead_letter(conn, alpha, 6)  # shown newest first: old[5] at the top
    chosen = old[2]

    async def scenario(pilot, app):
        await open_pane(pilot, "dlq")
        table = app.pane.query_one(LiveTable)
        table.move_cursor(row=table.get_row_index(str(chosen)))
        assert table.current_key == str(chosen)
        before = table.cursor_coordinate.row
        for _ in range(3):  # three refreshes, each with entries that sort above the chosen one
            new = dead_letter(conn, alpha, 2)
            await wait_for(pilot, lambda new=new: all(shown(table, str(i)) for i in new), what="the new entries")
            await pilot.pause(0.05)
            assert table.current_key == str(chosen)
        assert table.cursor_coordinate.row == before + 6  # it moved down with its entry
        await pilot.press("R")
        await confirm(pilot, f"DLQ entry {chosen} ")
        await wait_for(pilot, lambda: scalar(conn, "SELECT count(*) FROM courier.dlq WHERE status = 'redriven'"),
                       what="the redrive")
    run_console(dsn, scenario, refresh_scale=0.2)
    redriven = [row[0] for row in conn.execute("SELECT id FROM courier.dlq WHERE status = 'redriven'")]
    assert redriven == [chosen]


def test_dlq_marks_follow_their_entries_while_new_entries_arrive(dsn, conn, alpha):
    old = dead_letter(conn, alpha, 6)  # rows, top to bottom: old[5], old[4], ..., old[0]

    async def scenario(pilot, app):
        await open_pane(pilot, "dlq")
        pane = app.pane
        table = pane.query_one(LiveTable)
        table.move_cursor(row=table.get_row_index(str(old[4])))
        await pilot.press("space")  # marks old[4]; the cursor goes down to old[3]
        assert table.current_key == str(old[3])
        new = dead_letter(conn, alpha, 3)  # three rows arrive above
        await wait_for(pilot, lambda: all(shown(table, str(i)) for i in new), what="the new entries")
        await pilot.pause(0.05)
        assert table.current_key == str(old[3])
        await pilot.press("down")  # to old[2], the row below old[3]
        await pilot.press("space")
        assert pane.selected == {old[4], old[2]}
        more = dead_letter(conn, alpha, 2)
        await wait_for(pilot, lambda: all(shown(table, str(i)) for i in more), what="more entries")
        await pilot.pause(0.05)
        assert pane.selected == {old[4], old[2]}
        assert marked_rows(table) == {old[4], old[2]}
        await pilot.press("S")
        await confirm(pilot, "2 selected")
        await wait_for(pilot, lambda: scalar(conn, "SELECT count(*) FROM courier.dlq WHERE status = 'redriven'") == 2,
                       what="the selection's redrive")
    run_console(dsn, scenario, refresh_scale=0.2)
    redriven = {row[0] for row in conn.execute("SELECT id FROM courier.dlq WHERE status = 'redriven'")}
    assert redriven == {old[4], old[2]}


class OneTable(App):
    def compose(self) -> ComposeResult:
        yield LiveTable([("id", "id"), ("name", "name")])


def rows(*ids: int) -> list[tuple[str, list[str]]]:
    return [(str(i), [str(i), f"row {i}"]) for i in ids]


def test_live_table_cursor_follows_its_key_through_inserts_removals_and_filters():
    async def main() -> None:
        app = OneTable()
        async with app.run_test() as pilot:
            table = app.query_one(LiveTable)
            table.sync(rows(5, 4, 3, 2, 1))
            await pilot.pause()
            table.move_cursor(row=2)
            assert table.current_key == "3"
            table.sync(rows(8, 7, 6, 5, 4, 3, 2, 1))  # inserted above
            assert table.current_key == "3"
            assert table.cursor_coordinate.row == 5
            table.sync(rows(8, 7, 6, 5, 4, 2, 1))  # its row went: the next one below it
            assert table.current_key == "2"
            table.sync(rows(9, 8, 7, 6, 5, 4))  # it and every row below went: the one above
            assert table.current_key == "4"
            table.set_filter("row 5")
            assert table.current_key == "5"
            table.set_filter("")
            assert table.current_key == "5"
            assert table.cursor_coordinate.row == 4
    asyncio.run(main())
