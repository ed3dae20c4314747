"""A loopback TCP proxy to PostgreSQL that a test can cut and restore, to play a database
that goes away and comes back without touching the server other tests share."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

import psycopg


def _target(dsn: str) -> tuple[int, object]:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    host = params.get("host") or "/tmp"
    port = int(params.get("port") or 5432)
    if str(host).startswith("/"):
        return socket.AF_UNIX, os.path.join(host, f".s.PGSQL.{port}")
    return socket.AF_INET, (host, port)


class PostgresProxy:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._family, self._address = _target(dsn)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._up = threading.Event()
        self._up.set()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def proxied_dsn(self) -> str:
        params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        params.update(host="127.0.0.1", port=str(self.port))
        return psycopg.conninfo.make_conninfo("", **params)

    def cut(self) -> None:
        """Drop every connection and refuse new ones until restore()."""
        self._up.clear()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def restore(self) -> None:
        self._up.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                client.close()
                continue
            try:
                upstream = socket.socket(self._family, socket.SOCK_STREAM)
                upstream.connect(self._address)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.close()
