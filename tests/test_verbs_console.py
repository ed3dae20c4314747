"""The console's issue-42 actions under Pilot, each asserted in PostgreSQL: `x` on the Messages
pane cancels the message under the cursor, `P` on the DLQ pane purges its endpoint's DLQ."""

from __future__ import annotations

from console.app.widgets.confirm import ConfirmModal
from console.app.widgets.live_table import LiveTable
from tests.console_driver import dead_letter, open_pane, run_console, wait_for
from tests.helpers import message_status, scalar


async def confirm(pilot, expected_text: str) -> None:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmModal), what="the confirmation")
    assert expected_text in pilot.app.screen.question
    await pilot.press("y")


def test_x_cancels_the_message_under_the_cursor(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('alpha', 'noop', '{}')")
    ids = [scalar(conn, "SELECT courier.send('alpha', '{}')") for _ in range(3)]

    async def scenario(pilot, app):
        await open_pane(pilot, "messages")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 3, what="the messages")
        table.move_cursor(row=table.get_row_index(str(ids[1])))
        await pilot.press("x")
        await confirm(pilot, f"Cancel message {ids[1]}?")
        await wait_for(pilot, lambda: message_status(conn, ids[1]) == "cancelled", what="the cancel")
    run_console(dsn, scenario)
    assert [message_status(conn, i) for i in ids] == ["pending", "cancelled", "pending"]
    assert scalar(conn, "SELECT details ->> 'by' FROM courier.event_log WHERE event_type = 'message.cancelled'") \
        == "console"


def test_p_purges_the_dlq_of_the_entrys_endpoint_naming_the_count(dsn, conn):
    for name in ("alpha", "beta"):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    alpha = dead_letter(conn, "alpha", 3)
    dead_letter(conn, "beta", 2)

    async def scenario(pilot, app):
        await open_pane(pilot, "dlq")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 5, what="the DLQ")
        table.move_cursor(row=table.get_row_index(str(alpha[0])))
        await pilot.press("P")
        await confirm(pilot, "Purge the 3 failed DLQ entries of endpoint alpha?")
        await wait_for(pilot, lambda: scalar(conn, "SELECT count(*) FROM courier.dlq") == 2, what="the purge")
    run_console(dsn, scenario)
    assert conn.execute("SELECT DISTINCT endpoint_name FROM courier.dlq").fetchall() == [("beta",)]
