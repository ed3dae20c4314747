"""The Tokens pane under Pilot: tokens listed by name and scope and never by secret or hash,
made with the secret shown once (and working), revoked after the confirmation."""

from __future__ import annotations

import asyncio

import psycopg
from textual.widgets import Checkbox, DataTable, Input, Static

from console.app.widgets.confirm import ConfirmModal
from console.app.widgets.live_table import LiveTable
from console.app.widgets.token_forms import CreateTokenForm, TokenSecretModal
from sqlkit import tokens
from tests.console_driver import open_pane, run_console, wait_for
from tests.helpers import scalar


def table_text(app) -> str:
    table = app.pane.query_one(DataTable)
    return "\n".join(" ".join(getattr(cell, "plain", str(cell)) for cell in table.get_row(key)) for key in table.rows)


def authenticate(dsn: str, secret: str) -> tokens.Token | None:
    async def look_up() -> tokens.Token | None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await tokens.authenticate(conn, secret)
    return asyncio.run(look_up())


def test_the_list_shows_names_and_scopes_but_no_secret(dsn, conn):
    secret = tokens.create_token(conn, "pickers", topics=["warehouse", "returns"], endpoints=[], actions=["consume"])
    tokens.create_token(conn, "deployer", topics=[], endpoints=["billing"], actions=["enqueue"])
    tokens.revoke_token(conn, "deployer")
    stored_hash = scalar(conn, "SELECT secret_hash FROM courier.api_tokens WHERE name = 'pickers'")

    async def scenario(pilot, app):
        await open_pane(pilot, "tokens")
        await wait_for(pilot, lambda: app.pane.query_one(LiveTable).row_count == 2, what="both tokens")
        shown = table_text(app)
        assert "pickers" in shown and "warehouse, returns" in shown and "consume" in shown
        assert "deployer" in shown and "billing" in shown and "revoked" in shown
        screen = app.export_screenshot()
        for leak in (secret, secret[len(tokens.PREFIX):], stored_hash.hex()):
            assert leak not in shown and leak not in screen
    run_console(dsn, scenario)


def test_create_shows_the_secret_once_and_the_token_works(dsn, conn):
    shown: dict[str, str] = {}

    async def scenario(pilot, app):
        await open_pane(pilot, "tokens")
        await pilot.press("n")
        form = await wait_for(pilot, lambda: isinstance(app.screen, CreateTokenForm) and app.screen, what="the form")
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert "name: required" in str(form.query_one("#form-error", Static).render())
        form.query_one("#name", Input).value = "ingest"
        form.query_one("#topics", Input).value = "orders, billing ,"
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert "can: choose" in str(form.query_one("#form-error", Static).render())
        form.query_one("#can-enqueue", Checkbox).value = True
        form.query_one("#can-consume", Checkbox).value = True
        await pilot.press("ctrl+s")
        modal = await wait_for(pilot, lambda: isinstance(app.screen, TokenSecretModal) and app.screen,
                               what="the secret")
        secret = modal.secret
        shown["secret"] = secret
        assert secret.startswith(tokens.PREFIX)
        assert secret in str(modal.query_one("#secret", Static).render())
        assert "not shown again" in str(modal.query_one("#warning", Static).render())
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, TokenSecretModal), what="the secret to close")
        assert modal.secret == ""
        await wait_for(pilot, lambda: "ingest" in table_text(app), what="the new token in the list")
        assert secret not in table_text(app) and secret not in app.export_screenshot()
    run_console(dsn, scenario)

    token = authenticate(dsn, shown["secret"])
    assert token is not None and token.name == "ingest"
    assert token.topics == ["orders", "billing"] and token.actions == ["enqueue", "consume"]
    # Only the hash is stored.
    assert scalar(conn, "SELECT count(*) FROM courier.api_tokens WHERE secret_hash = sha256(%s::bytea)",
                  (shown["secret"].encode(),)) == 1


def test_a_refused_name_is_shown_in_the_form(dsn, conn):
    tokens.create_token(conn, "taken", topics=[], endpoints=[], actions=["admin"])

    async def scenario(pilot, app):
        await open_pane(pilot, "tokens")
        await pilot.press("n")
        form = await wait_for(pilot, lambda: isinstance(app.screen, CreateTokenForm) and app.screen, what="the form")
        form.query_one("#can-admin", Checkbox).value = True
        for name, expected in (("has space", "must be 1-128 letters"), ("taken", "exists already")):
            form.query_one("#name", Input).value = name
            await pilot.press("ctrl+s")
            error = await wait_for(pilot, lambda: str(form.query_one("#form-error", Static).render()),
                                   what="the inline error")
            assert expected in error
            assert app.screen is form
            form.show_error("")
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT count(*) FROM courier.api_tokens") == 1


def test_revoke_asks_first_then_revokes(dsn, conn):
    secret = tokens.create_token(conn, "pickers", topics=["warehouse"], endpoints=[], actions=["consume"])
    tokens.create_token(conn, "other", topics=["warehouse"], endpoints=[], actions=["consume"])

    def revoked(name: str) -> bool:
        return scalar(conn, "SELECT revoked_at IS NOT NULL FROM courier.api_tokens WHERE name = %s", (name,))

    async def scenario(pilot, app):
        await open_pane(pilot, "tokens")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 2, what="both tokens")
        table.move_cursor(row=table.get_row_index("pickers"))
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        assert "Revoke token pickers?" in app.screen.question
        await pilot.press("n")
        await pilot.pause(0.3)
        assert not revoked("pickers")
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: revoked("pickers"), what="the revocation")
        await wait_for(pilot, lambda: "revoked" in table_text(app), what="the list to say so")
    run_console(dsn, scenario)
    assert not revoked("other")
    assert authenticate(dsn, secret) is None
