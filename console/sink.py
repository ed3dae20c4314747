"""A local webhook sink for the demo, the tests and benchmarks: it answers by path and
remembers what it received.

    /healthy            200
    /flaky              503 about 30% of the time, else 200
    /slow               200 after 0.2-1.5 s
    /status/<code>      <code>; ?retry_after=N adds a Retry-After header
    /sleep/<ms>         200 after <ms> milliseconds
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the default listen backlog of 5 resets bursts of new connections
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that hung up before its answer (a worker's timeout or drain) is routine
        # for a webhook, not a traceback on stderr.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class WebhookSink:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, record: bool = True,
                 on_request: Callable[[ReceivedRequest], None] | None = None) -> None:
        sink = self
        self.received: list[ReceivedRequest] = []
        self._record = record
        self._on_request = on_request
        self._lock = threading.Lock()
        self._in_progress = 0
        self.most_at_once = 0
        """The most requests the sink was answering at the same moment."""

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body leave in two writes; with Nagle on, the second waits for the
            # client's delayed ACK, 40 ms a request on keep-alive connections.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                sink._handle(self)

            do_PUT = do_PATCH = do_GET = do_DELETE = do_POST

            def log_message(self, *args: object) -> None:
                return None

        self._server = _Server((host, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> WebhookSink:
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-sink", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def count(self, path_prefix: str = "") -> int:
        with self._lock:
            return sum(1 for r in self.received if r.path.startswith(path_prefix))

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self._in_progress += 1
            self.most_at_once = max(self.most_at_once, self._in_progress)
        try:
            self._answer_request(handler)
        finally:
            with self._lock:
                self._in_progress -= 1

    def _answer_request(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length) if length else b""
        url = urlsplit(handler.path)
        request = ReceivedRequest(handler.command, url.path, {k.lower(): v for k, v in handler.headers.items()}, body)
        if self._record:
            with self._lock:
                self.received.append(request)
        if self._on_request is not None:
            self._on_request(request)
        status, extra = self._answer(url.path, parse_qs(url.query))
        handler.send_response(status)
        for key, value in extra.items():
            handler.send_header(key, value)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", "2")
        handler.end_headers()
        handler.wfile.write(b"{}")

    @staticmethod
    def _answer(path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str]]:
        parts = path.strip("/").split("/")
        extra = {"retry-after": query["retry_after"][0]} if "retry_after" in query else {}
        if parts[0] == "flaky":
            return (503 if random.random() < 0.3 else 200), extra
        if parts[0] == "slow":
            time.sleep(random.uniform(0.2, 1.5))
            return 200, extra
        if parts[0] == "status" and len(parts) > 1 and parts[1].isdigit():
            return int(parts[1]), extra
        if parts[0] == "sleep" and len(parts) > 1 and parts[1].isdigit():
            time.sleep(int(parts[1]) / 1000)
            return 200, extra
        return 200, extra


def main() -> None:
    """`python -m console.sink --port 8787`: run the sink in the foreground."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--no-record", action="store_true", help="do not keep received requests in memory")
    args = parser.parse_args()
    sink = WebhookSink(args.host, args.port, record=not args.no_record)
    print(sink.url, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        sink.serve_forever()


if __name__ == "__main__":
    main()
