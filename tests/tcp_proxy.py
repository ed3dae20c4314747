"""A loopback proxy that a test can cut, stall and restore, to play a server (PostgreSQL or a
broker) that goes away and comes back without touching the server other tests share."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

import psycopg

HOST = "127.0.0.1"


class TcpProxy:
    """Forwards 127.0.0.1:<port> to address (a (host, port) pair, or a Unix socket path):
    cut() drops every connection and refuses new ones until restore(); stall() keeps
    connections open but forwards nothing until restore()."""

    def __init__(self, port: int, host: str = HOST, *, address: tuple[str, int] | str | None = None) -> None:
        self._address = address if address is not None else (host, port)
        self._family = socket.AF_UNIX if isinstance(self._address, str) else socket.AF_INET
        self._listener = socket.create_server((HOST, 0))
        self.port = self._listener.getsockname()[1]
        self._up = threading.Event()
        self._up.set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._up.clear()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def stall(self) -> None:
        self._flowing.clear()

    def restore(self) -> None:
        self._up.set()
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self.restore()
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
                self._flowing.wait()
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.close()


class PostgresProxy(TcpProxy):
    """A TcpProxy in front of the server of a DSN, whether it listens on TCP or a Unix socket."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        host = str(params.get("host") or "/tmp")
        port = int(params.get("port") or 5432)
        address = os.path.join(host, f".s.PGSQL.{port}") if host.startswith("/") else (host, port)
        super().__init__(port, address=address)

    @property
    def proxied_dsn(self) -> str:
        params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        params.update(host=HOST, port=str(self.port))
        return psycopg.conninfo.make_conninfo("", **params)
