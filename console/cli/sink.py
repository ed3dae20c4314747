"""`courier sink`: a local webhook receiver to try endpoints against, printing what arrives."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable

import click
from rich.text import Text

from ..literal import literal
from ..sink import ReceivedRequest, WebhookSink
from .context import console, error_console, wants_json


@click.command("sink")
@click.option("--listen", default="127.0.0.1:9000", show_default=True, metavar="HOST:PORT",
              help="Address to listen on.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per request instead of a line.")
def sink(listen: str, as_json: bool) -> None:
    """Receive webhooks on HOST:PORT and print each request, until Ctrl-C.

    Every path answers 200, except /flaky (503 about 30% of the time), /slow (0.2-1.5 s),
    /status/<code> and /sleep/<ms>: the demo's endpoints, to try retries and circuits."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{listen!r} is not HOST:PORT", param_hint="--listen")
    try:
        receiver = WebhookSink(host, int(port), record=False, on_request=_printer(as_json or wants_json()))
    except OSError as error:
        error_console.print(f"error: cannot listen on {listen}: {error.strerror or error}", highlight=False)
        sys.exit(1)
    error_console.print(f"receiving webhooks on {receiver.url} (Ctrl-C stops)", highlight=False)
    # Ctrl-C and SIGTERM stop it cleanly, as they do `courier worker`, even when it was started
    # with SIGINT ignored (a background job of a script).
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, signal.default_int_handler)
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()


def _printer(as_json: bool) -> Callable[[ReceivedRequest], None]:
    def show(request: ReceivedRequest) -> None:
        body = request.body.decode("utf-8", "replace")
        if as_json:
            sys.stdout.write(json.dumps({"method": request.method, "path": request.path,
                                         "message_id": request.headers.get("x-courier-message-id"),
                                         "headers": request.headers, "body": body}) + "\n")
            sys.stdout.flush()
            return
        # Whatever the sender put in the path, a header or the body is shown literally.
        console.print(Text.assemble(literal(f"{request.method} {request.path}", "bold"), " ",
                                    literal(f"message {request.headers.get('x-courier-message-id', '?')}", "cyan"),
                                    " ", literal(body)), highlight=False, soft_wrap=True)
    return show


COMMANDS = [sink]
