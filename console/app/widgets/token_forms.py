"""Dialogs for the HTTP API's bearer tokens: make one, then show its secret this once.

Courier keeps only a token's SHA-256, so the secret dialog is the one place it is ever shown;
closing it forgets the secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from sqlkit import tokens

from ...literal import literal
from .forms import DatabaseForm
from .tickbox import Tickbox


@dataclass(frozen=True)
class NewToken:
    name: str
    secret: str


def parse_names(text: str) -> list[str]:
    """'orders, billing' -> ['orders', 'billing']: the comma-separated scope of a token."""
    return [name.strip() for name in text.split(",") if name.strip()]


class CreateTokenForm(DatabaseForm):
    SUBMIT_LABEL = "Create"
    DEFAULT_CSS = """
    CreateTokenForm #token-fields {
        grid-size: 2; grid-columns: 10 1fr; grid-gutter: 1 1; grid-rows: 1; height: auto; margin-top: 1;
    }
    CreateTokenForm #token-fields Input { background: $boost; }
    CreateTokenForm #token-fields Input:focus { background: $primary 30%; }
    CreateTokenForm #actions { height: 1; margin-top: 0; align-horizontal: left; }
    CreateTokenForm #actions Checkbox { margin-right: 1; }
    CreateTokenForm .hint { margin-top: 1; }
    """

    def fields(self) -> ComposeResult:
        yield Label("New API token", classes="title")
        with Grid(id="token-fields"):
            yield Label("name")
            yield Input(placeholder="ci-deploy (letters, digits, _ . : -)", compact=True, id="name")
            yield Label("can")
            with Horizontal(id="actions"):
                for action in tokens.ACTIONS:
                    yield Tickbox(action, compact=True, id=f"can-{action}")
            yield Label("topics")
            yield Input(placeholder="orders, billing (* for every topic)", compact=True, id="topics")
            yield Label("endpoints")
            yield Input(placeholder="push endpoints it may send to (* for every one)", compact=True,
                        id="endpoints")
        yield Static("admin: everything, every topic and endpoint. The secret is shown once.",
                     classes="hint")

    def on_mount(self) -> None:
        self.query_one("#name", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_submit()

    def action_submit(self) -> None:
        name = self.query_one("#name", Input).value.strip()
        actions = [a for a in tokens.ACTIONS if self.query_one(f"#can-{a}", Tickbox).value]
        topics = parse_names(self.query_one("#topics", Input).value)
        endpoints = parse_names(self.query_one("#endpoints", Input).value)
        if not name:
            self.show_error("name: required")
            return
        if not actions:
            self.show_error("can: choose at least one thing the token may do")
            return
        self.show_error("")
        self.save(lambda conn: NewToken(name, tokens.create_token(conn, name, topics=topics, endpoints=endpoints,
                                                                  actions=actions)))


class TokenSecretModal(ModalScreen[None]):
    """The new token's secret, shown this once; c copies it to the clipboard."""

    DEFAULT_CSS = """
    TokenSecretModal { align: center middle; }
    TokenSecretModal > Vertical {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: thick $warning; background: $surface; padding: 0 1;
    }
    TokenSecretModal #secret {
        margin-top: 1; padding: 0 1; background: $boost; color: $text-accent; text-style: bold; width: 100%;
    }
    TokenSecretModal #warning { color: $text-warning; text-style: bold; margin-top: 1; }
    TokenSecretModal .hint { color: $text-muted; }
    TokenSecretModal Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    TokenSecretModal Button { margin-left: 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "copy", "Copy", id="token_secret.copy"),
        Binding("escape,enter", "close", "Done", id="token_secret.close"),
    ]

    def __init__(self, token: NewToken) -> None:
        super().__init__()
        self.name_text = token.name
        self.secret = token.secret

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(literal(f"Token {self.name_text} created"), classes="title")
            yield Static(literal(self.secret), id="secret")
            yield Static("Copy it now: it is not shown again. Courier keeps only its hash.", id="warning")
            yield Static("Clients send it as the header  Authorization: Bearer <token>", classes="hint")
            with Horizontal():
                yield Button("Copy (c)", id="copy", compact=True)
                yield Button("Done (enter)", id="done", variant="primary", compact=True)

    def on_mount(self) -> None:
        self.query_one("#done", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "copy":
            self.action_copy()
        else:
            self.action_close()

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.secret)
        self.notify("copied to the clipboard (where the terminal allows it)", timeout=3)

    def action_close(self) -> None:
        self.secret = ""  # nothing keeps it once the dialog is gone
        self.dismiss(None)
