"""http: `courier serve`, the HTTP pull API, against the SQL API it calls, in the same run.

The server is started by the scenario as a user starts it (`courier serve --listen ... --dsn
...`) against the scratch database, pinned to one CPU where the OS allows (one core's worth
of server), and stopped with SIGTERM at the end, or on any failure.

- enqueue, batch 1: `--clients` clients (one keep-alive connection each) POSTing
  /api/messages in a closed loop, against as many psycopg connections calling
  `courier.enqueue(topic, NULL, p_payload_binary => payload)` (the server's own call: a base64
  payload is stored as the binary payload), one per transaction.
- enqueue, batch 100: POST /api/messages/batch of 100, against courier.enqueue_batch of 100
  binary payloads (the server's own call for a run of one topic's unkeyed messages), one
  transaction each.
- dequeue(100) + ack: POST /api/messages/dequeue then /api/messages/ack with the batch's
  receipts, against courier.dequeue(topic, 100, 60) then courier.ack(ids, leases), on a topic
  preloaded for each run.
- enqueue latency: single enqueues offered at a fixed rate (1,000/s) in an open loop, each
  request timed from the moment it was due to its answer, so a stall shows in every request
  it delays; the same through SQL is measured beside it for reference.

With `--processes N`, enqueue (batch 1) and its latency are also measured through `courier
serve --processes N`, under at least SCALING_CLIENTS clients each way.

Throughput figures are messages per second; each HTTP figure's ceiling is the SQL path's with
the same number of clients, measured in the same run (BENCHMARKS.md: >= 0.5 of it; enqueue
p99 <= 10 ms at 1,000/s). Both kinds of client run in this process, on one asyncio loop.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import psycopg

from sqlkit import tokens
from sqlkit.connection import connect, connect_async
from sqlkit.errors import CourierError

from .result import Measurement, ScenarioResult, measure_rounds
from .scratch import backpressure_out_of_reach, free_port

TOPIC = "bench-http"
BATCH = 100
VISIBILITY_SECONDS = 60
LATENCY_RATE = 1_000.0
LATENCY_TARGET_MS = 10.0
SCALING_CLIENTS = 16
"""The fewest clients `--processes N` is measured with. Serving at scale is many clients: with
four in a closed loop each waits for the HTTP hop in series with its own commit, so the figure is
the hop's latency (the first row shows it), and no number of server processes moves it."""
WARM_UP_SECONDS = 1.0
"""Paced load offered before each latency run and left out of its figures."""
LATENCY_CONNECTIONS = 32
"""Connections the paced load may open: enough that a slow answer never holds back the schedule."""
PAYLOAD = json.dumps({"order_id": 1, "amount": 99.99, "customer": "c-789"}).encode()

SQL_ENQUEUE = "SELECT courier.enqueue(p_topic => %s, p_payload => NULL, p_payload_binary => %s)"
SQL_ENQUEUE_BATCH = "SELECT unnest(courier.enqueue_batch(%s, NULL, %s::bytea[]))"
SQL_DEQUEUE = ("SELECT id, lease, payload, payload_binary, metadata, key, retry_count, max_retries, created_at, "
               "visible_until FROM courier.dequeue(%s, %s, %s)")
SQL_ACK = "SELECT id, result FROM courier.ack(%s::bigint[], %s::integer[])"


# The server -------------------------------------------------------------------------

def _server_cpu() -> int | None:
    """The CPU to pin the server to: the last one this process may use (None: cannot pin)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return max(os.sched_getaffinity(0))


class ServeProcess(subprocess.Popen):
    """`courier serve` on a free loopback port, its log kept so a failure can say why."""

    def __init__(self, dsn: str, log: IO[str], processes: int = 1) -> None:
        self.port = free_port()
        # The DSN in the environment, not --dsn: any local user can read a command line.
        env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
        env["COURIER_DSN"] = dsn
        super().__init__([sys.executable, "-P", "-c", "from console.cli import main; main()", "serve",
                          "--listen", f"127.0.0.1:{self.port}", "--processes", str(processes)],
                         env=env, stdout=subprocess.DEVNULL, stderr=log)
        self._log = log
        self.url = f"http://127.0.0.1:{self.port}"
        # One process is pinned to one core (a core's worth of server); several share them all.
        self.cpu = _server_cpu() if processes == 1 else None
        if self.cpu is not None:
            try:  # before the interpreter has started a thread: every later one inherits it
                os.sched_setaffinity(self.pid, {self.cpu})
            except OSError:
                self.cpu = None

    def wait_until_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.poll() is not None or time.monotonic() > deadline:
                    raise self.failure("`courier serve` did not start") from None
                time.sleep(0.05)

    def failure(self, what: str) -> CourierError:
        self._log.seek(0)
        lines = [line.strip() for line in self._log if line.strip()]
        state = "still running" if self.poll() is None else f"exited with code {self.returncode}"
        line = lines[-1] if lines else ""
        line = line if len(line) <= 500 else f"{line[:150]} ... {line[-350:]}"  # a traceback ends with its error
        last = f"; its last log line: {line}" if line else ""
        return CourierError(f"{what}: `courier serve` {state}{last}")


@contextlib.contextmanager
def serve_process(dsn: str, processes: int = 1) -> Iterator[ServeProcess]:
    """`courier serve` listening on loopback; SIGTERM on the way out, whatever happened."""
    with tempfile.TemporaryFile("w+") as log:
        process = ServeProcess(dsn, log, processes)
        try:
            process.wait_until_listening()
            if processes > 1:
                time.sleep(3)  # the siblings start once the first has bound
            try:
                yield process
            except (CourierError, OSError) as error:  # say what the server logged
                raise process.failure(error.one_line() if isinstance(error, CourierError)
                                      else f"{type(error).__name__}: {error}") from error
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# Preparing the topic ----------------------------------------------------------------

def _prepare(dsn: str) -> str:
    """The pull topic, backpressure out of reach, and a token that may use it: its secret."""
    with connect(dsn) as conn:
        if not conn.execute("SELECT 1 FROM courier.endpoints WHERE name = %s", (TOPIC,)).fetchone():
            conn.execute("SELECT courier.create_endpoint(%s, 'pull', '{}')", (TOPIC,))
        backpressure_out_of_reach(conn)
        return tokens.create_token(conn, f"bench-http-{os.getpid()}-{time.time_ns()}", topics=["*"], endpoints=[],
                                   actions=["enqueue", "consume"])


def _empty(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE courier.queue, courier.archive")
        conn.execute("VACUUM ANALYZE courier.queue_depth")


def _preload(dsn: str, messages: int) -> None:
    """Fill the topic with one INSERT: rows as courier.enqueue() makes them from a binary payload."""
    with connect(dsn) as conn:
        conn.execute("TRUNCATE courier.queue, courier.archive")
        conn.execute("INSERT INTO courier.queue (endpoint_id, payload, payload_binary, visible_at) "
                     "SELECT e.id, 'null'::jsonb, convert_to(format('{\"n\": %%s}', g), 'UTF8'), now() "
                     "FROM courier.endpoints e, generate_series(1, %s::int) g WHERE e.name = %s",
                     (messages, TOPIC))
        conn.execute("VACUUM ANALYZE courier.queue")
        conn.execute("VACUUM ANALYZE courier.queue_depth")


# Clients ----------------------------------------------------------------------------

Step = Callable[[], Awaitable[int]]
"""One request (or transaction) of a client; how many messages it moved (0: nothing left)."""


async def _closed_loop(steps: list[Step], seconds: float) -> Measurement:
    """Every client runs its step back to back until `seconds` pass or the topic is empty."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    moved = 0
    durations: list[float] = []

    async def client(step: Step) -> None:
        nonlocal moved
        while loop.time() < deadline:
            began = loop.time()
            done = await step()
            durations.append(loop.time() - began)
            if not done:
                return
            moved += done

    started = loop.time()
    await asyncio.gather(*(client(step) for step in steps))
    elapsed = loop.time() - started
    return Measurement(moved / elapsed, 1000 * statistics.fmean(durations) if durations else 0.0)


class _Connection:
    """One keep-alive HTTP/1.1 connection that speaks only what the bench needs: a POST with a
    body of known length, answered with a Content-Length body (as `courier serve` answers).

    The bench's clients share the machine's cores with the server and PostgreSQL, so what a
    client costs comes off what the server gets. aiohttp's client spent 0.24 ms of CPU per
    request, psycopg 0.13 ms per statement and this one 0.08 ms (measured here): with aiohttp the
    HTTP path paid for a load generator twice as heavy as the SQL path's."""

    def __init__(self, host: str, port: int, secret: str) -> None:
        self.host, self.port = host, port
        self.head = (f"Host: {host}:{port}\r\nAuthorization: Bearer {secret}\r\n"
                     "Content-Type: application/json\r\n").encode()
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        writer.write(b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), self.head, len(body), body))
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            status, length, closing = _answer_head(head)
            answer = await reader.readexactly(length)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as error:
            self.close()
            raise CourierError(f"POST {path}: the connection broke ({type(error).__name__})") from error
        if closing:
            self.close()
        return status, answer

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


def _answer_head(head: bytes) -> tuple[int, int, bool]:
    """Status, Content-Length and whether the server closes the connection, from an answer's
    status line and headers."""
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise CourierError(f"not an HTTP answer: {lines[0][:100]!r}") from None
    fields = dict((name.strip().lower(), value.strip()) for name, _, value in
                  (line.partition(":") for line in lines[1:] if line))
    if "content-length" not in fields:
        raise CourierError(f"an answer without Content-Length ({status}): the bench reads only those")
    return status, int(fields["content-length"]), fields.get("connection", "").lower() == "close"


class _Http:
    """The bench's HTTP clients against one server: a _Connection per closed-loop client, and
    for the paced load LATENCY_CONNECTIONS of them, each opened at its first request."""

    def __init__(self, url: str, secret: str) -> None:
        address = url.removeprefix("http://")
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.secret = secret

    def connection(self) -> _Connection:
        return _Connection(self.host, self.port, self.secret)

    async def post(self, connection: _Connection, path: str, body: bytes) -> Any:
        status, text = await connection.post(path, body)
        if status >= 300:
            raise CourierError(f"POST {path} answered {status}: {text[:300].decode(errors='replace')}")
        return json.loads(text)


def _enqueue_body(size: int) -> bytes:
    message = {"topic": TOPIC, "payload": base64.b64encode(PAYLOAD).decode()}
    return json.dumps(message if size == 1 else {"messages": [message] * size}).encode()


def _http_enqueue(url: str, secret: str, clients: int, seconds: float, size: int) -> Measurement:
    http = _Http(url, secret)
    path, body = ("/api/messages", _enqueue_body(1)) if size == 1 else ("/api/messages/batch", _enqueue_body(size))

    async def main() -> Measurement:
        connections = [http.connection() for _ in range(clients)]
        try:
            async def step(connection: _Connection) -> int:
                answer = await http.post(connection, path, body)
                return 1 if size == 1 else len(answer["ids"])
            return await _closed_loop([lambda c=c: step(c) for c in connections], seconds)
        finally:
            for connection in connections:
                connection.close()

    return asyncio.run(main())


async def _sql_connections(dsn: str, count: int) -> list[psycopg.AsyncConnection]:
    return list(await asyncio.gather(*(connect_async(dsn) for _ in range(count))))


def _sql_enqueue(dsn: str, clients: int, seconds: float, size: int) -> Measurement:
    payloads = [PAYLOAD] * size

    async def main() -> Measurement:
        conns = await _sql_connections(dsn, clients)
        try:
            async def step(conn: psycopg.AsyncConnection) -> int:
                if size == 1:
                    await (await conn.execute(SQL_ENQUEUE, (TOPIC, PAYLOAD))).fetchone()
                    return 1
                return len(await (await conn.execute(SQL_ENQUEUE_BATCH, (TOPIC, payloads))).fetchall())
            return await _closed_loop([lambda c=c: step(c) for c in conns], seconds)
        finally:
            await asyncio.gather(*(c.close() for c in conns))

    return asyncio.run(main())


def _http_drain(url: str, secret: str, clients: int, seconds: float) -> Measurement:
    http = _Http(url, secret)
    dequeue = json.dumps({"topic": TOPIC, "count": BATCH, "visibility_timeout_seconds": VISIBILITY_SECONDS}).encode()

    async def main() -> Measurement:
        connections = [http.connection() for _ in range(clients)]
        try:
            async def step(connection: _Connection) -> int:
                leased = (await http.post(connection, "/api/messages/dequeue", dequeue))["messages"]
                if not leased:
                    return 0
                ack = json.dumps({"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in leased]}).encode()
                results = (await http.post(connection, "/api/messages/ack", ack))["results"]
                return sum(1 for r in results if r["result"] == "acked")
            return await _closed_loop([lambda c=c: step(c) for c in connections], seconds)
        finally:
            for connection in connections:
                connection.close()

    return asyncio.run(main())


def _sql_drain(dsn: str, clients: int, seconds: float) -> Measurement:
    async def main() -> Measurement:
        conns = await _sql_connections(dsn, clients)
        try:
            async def step(conn: psycopg.AsyncConnection) -> int:
                rows = await (await conn.execute(SQL_DEQUEUE, (TOPIC, BATCH, VISIBILITY_SECONDS))).fetchall()
                if not rows:
                    return 0
                results = await (await conn.execute(SQL_ACK, ([r[0] for r in rows], [r[1] for r in rows]))).fetchall()
                return sum(1 for r in results if r[1] == "acked")
            return await _closed_loop([lambda c=c: step(c) for c in conns], seconds)
        finally:
            await asyncio.gather(*(c.close() for c in conns))

    return asyncio.run(main())


# Paced latency ----------------------------------------------------------------------

@dataclass(frozen=True)
class Paced:
    p50_ms: float
    p99_ms: float
    sent_per_second: float
    requests: int
    unanswered: int
    """Sends still unanswered `seconds` after the last was due: each counted with the time it had
    waited by then, so the quantiles are lower bounds when there are any."""


async def _paced(send: Callable[[], Awaitable[None]], rate: float, seconds: float) -> Paced:
    """Start a send every 1/rate s on a fixed schedule (an open loop), for `seconds` after
    WARM_UP_SECONDS left out; each latency runs from when the send was due to its end. A load
    the server cannot keep up with is cut off `seconds` after the schedule ends."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    failures: list[BaseException] = []
    measured: dict[asyncio.Task[None], float] = {}
    tasks: set[asyncio.Task[None]] = set()
    last_answer = loop.time()

    async def one(due: float, counted: bool) -> None:
        nonlocal last_answer
        try:
            await send()
        except Exception as error:  # reported after the run, not lost in a task
            failures.append(error)
            return
        last_answer = loop.time()
        if counted:
            latencies.append(1000 * (last_answer - due))

    warm_up = round(WARM_UP_SECONDS * rate)
    total = warm_up + max(1, round(seconds * rate))
    started = loop.time()
    for n in range(total):
        due = started + n / rate
        if (wait := due - loop.time()) > 0:
            await asyncio.sleep(wait)
        task = asyncio.create_task(one(due, n >= warm_up))
        tasks.add(task)
        if n >= warm_up:
            measured[task] = due
    measured_from = started + warm_up / rate
    _, late = await asyncio.wait(tasks, timeout=seconds)
    cut_off = loop.time()
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    if failures:
        raise failures[0]
    answered = len(latencies)
    latencies += [1000 * (cut_off - measured[task]) for task in late if task in measured]
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [latencies[0]] * 99
    elapsed = max((cut_off if late else last_answer) - measured_from, 1e-9)
    return Paced(quantiles[49], quantiles[98], answered / elapsed, len(latencies), len(latencies) - answered)


def _http_latency(url: str, secret: str, rate: float, seconds: float) -> Paced:
    http = _Http(url, secret)
    body = _enqueue_body(1)

    async def main() -> Paced:
        # Each opens at its first request; as the SQL path, a request waits for one that is free.
        connections = [http.connection() for _ in range(LATENCY_CONNECTIONS)]
        idle: asyncio.Queue[_Connection] = asyncio.Queue()
        for connection in connections:
            idle.put_nowait(connection)

        async def send() -> None:
            connection = await idle.get()
            try:
                await http.post(connection, "/api/messages", body)
            finally:
                idle.put_nowait(connection)

        try:
            return await _paced(send, rate, seconds)
        finally:
            for connection in connections:
                connection.close()

    return asyncio.run(main())


def _sql_latency(dsn: str, rate: float, seconds: float) -> Paced:
    async def main() -> Paced:
        conns = await _sql_connections(dsn, LATENCY_CONNECTIONS)
        idle: asyncio.Queue[psycopg.AsyncConnection] = asyncio.Queue()
        for conn in conns:
            idle.put_nowait(conn)

        async def send() -> None:
            conn = await idle.get()
            try:
                await (await conn.execute(SQL_ENQUEUE, (TOPIC, PAYLOAD))).fetchone()
            finally:
                idle.put_nowait(conn)

        try:
            return await _paced(send, rate, seconds)
        finally:
            await asyncio.gather(*(c.close() for c in conns))

    return asyncio.run(main())


# The scenario -----------------------------------------------------------------------

def http(dsn: str, *, clients: int, seconds: float, rounds: int, messages: int = 300_000,
         rate: float = LATENCY_RATE, processes: tuple[int, ...] = ()) -> list[ScenarioResult]:
    """`messages`: how many each dequeue run finds preloaded (a run ends when they are gone, or
    after `seconds`); `rate`: the paced enqueue rate of the latency measure; `processes`: also
    enqueue (batch 1) and its latency through `courier serve --processes N` for each N."""
    secret = _prepare(dsn)
    many = [result for count in processes for result in _http_processes(dsn, secret, count, clients=clients,
                                                                        seconds=seconds, rounds=rounds, rate=rate)]
    with serve_process(dsn) as server:
        url = server.url

        def enqueue(path: str, size: int) -> Callable[[], Measurement]:
            def run() -> Measurement:
                _empty(dsn)
                if path == "http":
                    return _http_enqueue(url, secret, clients, seconds, size)
                return _sql_enqueue(dsn, clients, seconds, size)
            return run

        def drain(path: str) -> Callable[[], Measurement]:
            def run() -> Measurement:
                _preload(dsn, messages)
                if path == "http":
                    return _http_drain(url, secret, clients, seconds)
                return _sql_drain(dsn, clients, seconds)
            return run

        paced: dict[str, list[Paced]] = {"http": [], "sql": []}

        def latency(path: str) -> Callable[[], Measurement]:
            def run() -> Measurement:
                _empty(dsn)
                found = (_http_latency(url, secret, rate, seconds) if path == "http"
                         else _sql_latency(dsn, rate, seconds))
                paced[path].append(found)
                return Measurement(1000 / found.p99_ms, found.p99_ms)
            return run

        m = measure_rounds({
            "sql enqueue 1": enqueue("sql", 1), "http enqueue 1": enqueue("http", 1),
            f"sql enqueue {BATCH}": enqueue("sql", BATCH), f"http enqueue {BATCH}": enqueue("http", BATCH),
            "sql drain": drain("sql"), "http drain": drain("http"),
            "sql latency": latency("sql"), "http latency": latency("http"),
        }, rounds)
        if server.poll() is not None:
            raise server.failure("the server stopped during the run")
    _empty(dsn)

    pinned = (f"`courier serve` pinned to CPU {server.cpu} of {os.cpu_count()} (PostgreSQL and the clients "
              "not pinned)" if server.cpu is not None
              else "`courier serve` not pinned (no CPU affinity here)")
    clients_note = (f"{clients} clients in the bench process: one keep-alive HTTP/1.1 connection each (a lean "
                    f"client of the bench's own), vs {clients} psycopg connections; {pinned}")
    results = [
        ScenarioResult(
            scenario="http", variant=f"enqueue, batch 1, {clients} clients", unit="msg/s",
            courier=m["http enqueue 1"], ceiling=m["sql enqueue 1"], target_ratio=0.5,
            notes=f"POST /api/messages per message vs SELECT courier.enqueue(topic, NULL, p_payload_binary => "
                  f"payload) per transaction; {clients_note}"),
        ScenarioResult(
            scenario="http", variant=f"enqueue, batch {BATCH}, {clients} clients", unit="msg/s",
            courier=m[f"http enqueue {BATCH}"], ceiling=m[f"sql enqueue {BATCH}"], target_ratio=0.5,
            notes=f"POST /api/messages/batch of {BATCH} vs courier.enqueue_batch of {BATCH} binary payloads, "
                  f"one transaction each; {clients_note}"),
        ScenarioResult(
            scenario="http", variant=f"dequeue({BATCH}) + ack, {clients} clients", unit="msg/s",
            courier=m["http drain"], ceiling=m["sql drain"], target_ratio=0.5,
            notes=f"POST /api/messages/dequeue (count {BATCH}) then /api/messages/ack of the batch's receipts vs "
                  f"courier.dequeue(topic, {BATCH}, {VISIBILITY_SECONDS}) then courier.ack(ids, leases), two "
                  f"transactions each; {messages:,} messages preloaded per run, each run ends after {seconds:g} s "
                  f"or when the topic is empty; {clients_note}"),
    ]
    http_p = _median_paced(paced["http"])
    sql_p = _median_paced(paced["sql"])
    results.append(ScenarioResult(
        scenario="http", variant=f"enqueue p99 {http_p.p99_ms:,.1f} ms at {rate:,.0f}/s offered "
                                f"({http_p.sent_per_second:,.0f}/s answered)",
        unit="1000 / p99 ms", courier=m["http latency"], ceiling=None, target_absolute=1000 / LATENCY_TARGET_MS,
        notes=f"HTTP p99 {http_p.p99_ms:.1f} ms, p50 {http_p.p50_ms:.1f} ms over {http_p.requests:,} POST "
              f"/api/messages sent on a fixed schedule (open loop, up to {LATENCY_CONNECTIONS} keep-alive "
              f"connections), each timed from when it was due, after {WARM_UP_SECONDS:g} s of the same load left "
              f"out{_cut_off(http_p, seconds)}; the same through SQL (courier.enqueue, up to "
              f"{LATENCY_CONNECTIONS} connections): p99 {sql_p.p99_ms:.1f} ms, p50 {sql_p.p50_ms:.1f} ms at "
              f"{sql_p.sent_per_second:,.0f}/s answered{_cut_off(sql_p, seconds)}; target p99 <= "
              f"{LATENCY_TARGET_MS:g} ms; {pinned}"))
    return results + many


def _http_processes(dsn: str, secret: str, processes: int, *, clients: int, seconds: float, rounds: int,
                    rate: float) -> list[ScenarioResult]:
    """Enqueue (batch 1) and its paced latency through `courier serve --processes N`, against
    the SQL path with the same clients (at least SCALING_CLIENTS); no process pinned."""
    clients = max(clients, SCALING_CLIENTS)
    paced: list[Paced] = []
    with serve_process(dsn, processes) as server:
        def enqueue(path: str) -> Callable[[], Measurement]:
            def run() -> Measurement:
                _empty(dsn)
                return (_http_enqueue(server.url, secret, clients, seconds, 1) if path == "http"
                        else _sql_enqueue(dsn, clients, seconds, 1))
            return run

        def latency() -> Measurement:
            _empty(dsn)
            found = _http_latency(server.url, secret, rate, seconds)
            paced.append(found)
            return Measurement(1000 / found.p99_ms, found.p99_ms)

        m = measure_rounds({"sql": enqueue("sql"), "http": enqueue("http"), "latency": latency}, rounds)
        if server.poll() is not None:
            raise server.failure("the server stopped during the run")
    _empty(dsn)
    found = _median_paced(paced)
    where = f"`courier serve --processes {processes}` on {os.cpu_count()} CPUs, none pinned"
    return [
        ScenarioResult(
            scenario="http", variant=f"enqueue, batch 1, {clients} clients, {processes} processes", unit="msg/s",
            courier=m["http"], ceiling=m["sql"], target_ratio=0.8,
            notes=f"POST /api/messages per message vs SELECT courier.enqueue per transaction, {clients} clients "
                  f"each way (at least {SCALING_CLIENTS}: a load that keeps a server process busy; the first row's "
                  f"few clients measure the hop's latency instead); {where}"),
        ScenarioResult(
            scenario="http", variant=f"enqueue p99 {found.p99_ms:,.1f} ms at {rate:,.0f}/s offered, "
                                    f"{processes} processes",
            unit="1000 / p99 ms", courier=m["latency"], ceiling=None, target_absolute=1000 / LATENCY_TARGET_MS,
            notes=f"HTTP p99 {found.p99_ms:.1f} ms, p50 {found.p50_ms:.1f} ms over {found.requests:,} requests on a "
                  f"fixed schedule{_cut_off(found, seconds)}; {where}"),
    ]


def _median_paced(runs: list[Paced]) -> Paced:
    return Paced(statistics.median(r.p50_ms for r in runs), statistics.median(r.p99_ms for r in runs),
                 statistics.median(r.sent_per_second for r in runs), int(statistics.median(r.requests for r in runs)),
                 max(r.unanswered for r in runs))


def _cut_off(run: Paced, seconds: float) -> str:
    if not run.unanswered:
        return ""
    return (f" (overloaded: {run.unanswered:,} still unanswered {seconds:g} s after the schedule ended, "
            "counted as waiting until then, so the quantiles are lower bounds)")
