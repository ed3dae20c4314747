"""Tokens: the bearer tokens of the HTTP API (`courier serve`), with their scope and last use;
create one (its secret shown once) and revoke one; enter opens a token whole (what the table
shows, never a secret). A secret is never stored, and its hash is never read here."""

from __future__ import annotations

from typing import ClassVar

import psycopg
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from sqlkit import tokens
from sqlkit.tokens import Token

from ..formatting import since, state_text, when
from ..live import LivePane
from ..widgets.confirm import ConfirmModal
from ..widgets.detail import DetailModal
from ..widgets.live_table import LiveTable
from ..widgets.token_forms import CreateTokenForm, NewToken, TokenSecretModal


def scope(names: list[str]) -> str:
    return ", ".join(names) if names else "-"


def token_detail(t: Token, now, tz) -> DetailModal:
    """What the table shows of a token, whole: a Token holds no secret nor its hash."""
    fields = [("token", t.name), ("state", "revoked" if t.revoked_at else "live"), ("can", ", ".join(t.actions)),
              ("topics", scope(t.topics)), ("endpoints", scope(t.endpoints)),
              ("last used", f"{when(t.last_used_at, tz)} ({since(t.last_used_at, now)} ago)"
               if t.last_used_at else "never"),
              ("created", when(t.created_at, tz)), ("revoked", when(t.revoked_at, tz))]
    return DetailModal(f"Token {t.name}", fields)


class TokensPane(LivePane):
    TITLE_TEXT = "Tokens"
    REFRESH_SECONDS = 5.0
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "create", "New", tooltip="Make a token; its secret is shown once", id="tokens.create"),
        Binding("x", "revoke", "Revoke", tooltip="Revoke the token: requests that present it are refused",
                id="tokens.revoke"),
        Binding("o", "open", "Open", tooltip="Open the token: its scopes and uses whole (enter)", show=False,
                id="tokens.open"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.by_name: dict[str, Token] = {}

    def compose(self) -> ComposeResult:
        yield LiveTable([("name", "token"), ("state", "state"), ("actions", "can"), ("topics", "topics"),
                         ("endpoints", "endpoints"), ("last_used", "last used"), ("created", "created")],
                        id="tokens-table")

    def fetch(self, conn: psycopg.Connection) -> list[Token]:
        return tokens.list_tokens(conn)

    def show(self, found: list[Token]) -> None:
        now = self.courier.clock()
        tz = self.courier.tz
        colors = self.app.get_css_variables()
        self.by_name = {t.name: t for t in found}
        rows = []
        for t in sorted(found, key=lambda t: (t.revoked_at is not None, t.name)):
            state = state_text("revoked" if t.revoked_at else "live", colors)
            used = f"{since(t.last_used_at, now)} ago" if t.last_used_at else "never"
            rows.append((t.name, [t.name, state, ", ".join(t.actions), scope(t.topics), scope(t.endpoints),
                                  used, when(t.created_at, tz)[:16]]))
        self.query_one(LiveTable).sync(rows)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        if t := self._selected():
            self.app.push_screen(token_detail(t, self.courier.clock(), self.courier.tz))

    def _selected(self) -> Token | None:
        key = self.query_one(LiveTable).current_key
        token = self.by_name.get(key) if key else None
        if token is None:
            self.notify("no token selected", severity="warning", timeout=3)
        return token

    def action_create(self) -> None:
        def created(token: NewToken | None) -> None:
            if token is not None:
                self.poll_now()
                self.app.push_screen(TokenSecretModal(token))
        self.app.push_screen(CreateTokenForm(), created)

    def action_revoke(self) -> None:
        token = self._selected()
        if token is None:
            return
        if token.revoked_at is not None:
            self.notify(f"token {token.name} was revoked already", severity="warning", timeout=3)
            return
        name = token.name

        def answered(yes: bool | None) -> None:
            if yes:
                self.write(lambda conn: tokens.revoke_token(conn, name),
                           f"revoked token {name}".replace("{", "{{").replace("}", "}}"))
        self.app.push_screen(ConfirmModal(f"Revoke token {name}? Requests that present it are refused from "
                                          "now on. This cannot be undone.", "Revoke"), answered)
