"""Every example in README.md runs as written, in order, against a real database (as doctest
does for docstrings), so the README cannot drift from what Courier does.

Each fenced block is taken in the README's order: ```sh lines run in bash, ```sql blocks in
psql, ```python blocks as programs. They share one fresh database (COURIER_DSN), one
working directory with the files the README names (`invoice.pdf`, `events.jsonl`, ...), and
shell variables (a `TOKEN=$(...)` line is seen by the lines after it).

What cannot run to completion in a test is declared here, each with its reason:
- NOT_RUN: the install, the suite itself, the interactive console and the minutes-long
  benchmarks (each covered by its own tests);
- commands that run until stopped (`courier worker`, `courier serve`, `courier events
  --follow`) run for a few seconds, and must then stop cleanly on SIGINT; `courier serve`
  stays up in the background for the lines after it;
- placeholders in angle brackets (`<id>`, `<lease>`, `<receipt>`, `<dlq-id>`), which the
  README says stand for what an earlier command printed, are filled from the database at
  that moment (PLACEHOLDERS).
A line that fails fails the test with its README line number and output; so does one that
runs longer than LINE_SECONDS, and a test stopped by its own timeout names the line it was on.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(\w+)\s*$")

NOT_RUN = {
    "python3 -m venv": "the install itself: .ci/run does it on a fresh clone",
    ". .venv/bin/activate && pytest": "the test suite itself",
    "courier bench": "minutes per scenario; tests/test_bench*.py run each scenario at a small size",
    "courier console": "the interactive console needs a terminal; tests/test_console_*.py drive it with Pilot",
    "courier  ": "the interactive console (bare `courier`), as above",
}
RUN_FOR_SECONDS = {"courier worker": 8.0, "courier events --follow": 2.0, "courier demo --headless": 8.0,
                   'COURIER_DSN="$(courier db url)" python consume_orders.py': 8.0,
                   'COURIER_DSN="$(courier db url)" python receive_orders.py': 8.0}
PROGRAM_NAME = re.compile(r"^# (\w+\.py)\n")
BACKGROUND = ("courier serve",)
# The loopback ports the README's own servers listen on (`courier serve`, `courier sink`): each
# is swapped for a free port in every example, so that whatever else holds 8080 on the machine
# cannot fail the test. Brokers' ports (6379, 5672, ...) are real services, and stay.
LOCAL_PORTS = (8080, 8443, 9000)
LOCAL_ADDRESS = re.compile(r"(?<=127\.0\.0\.1:)(\d+)\b")
LINE_SECONDS = 300
"""The longest one README line (or SQL block) may run before the test fails naming it."""
README_SECONDS = 1200
"""The whole walk: 492 s were seen on a loaded machine, past the suite's default of 300."""

# Placeholder -> the SQL that finds its value at the moment the line runs.
PLACEHOLDERS = {
    # The oldest message of a topic held under a lease: what `dequeue` printed first.
    ("<id>", "<lease>"): """
        SELECT q.id::text, q.lease::text FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id
        WHERE e.protocol = 'pull' AND q.status = 'processing' ORDER BY q.id LIMIT 1""",
    # The HTTP API's opaque receipt: base64url of (message id, lease) as console.serve.messages.RECEIPT packs them.
    ("<receipt>",): """
        SELECT translate(encode(int8send(q.id) || int4send(q.lease), 'base64'), '+/', '-_')
        FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id
        WHERE e.protocol = 'pull' AND q.status = 'processing' ORDER BY q.id LIMIT 1""",
    ("<dlq-id>",): "SELECT max(id)::text FROM courier.dlq WHERE status = 'failed'",
    ("<archive-id>",): "SELECT max(id)::text FROM courier.archive",
}

# Files the README's examples read, as a user would have them.
FILES = {
    "invoice.pdf": b"%PDF-1.4\n% an invoice\n",
    "events.jsonl": b'{"id": 1, "region": "eu"}\n{"id": 2, "region": "us"}\n',
    "backfill.jsonl": b'{"order": {"total": 120}}\n{"order": {"total": 80}}\n',
}


@dataclass(frozen=True)
class Example:
    language: str
    line: int  # of the block's first line in README.md
    code: str


def examples(text: str) -> list[Example]:
    found, language, start, body = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if language is None:
            match = FENCE.match(line)
            if match and match.group(1) in ("sh", "sql", "python"):
                language, start, body = match.group(1), number + 1, []
        elif line.startswith("```"):
            found.append(Example(language, start, "\n".join(body)))
            language = None
        else:
            body.append(line)
    return found


def shell_lines(example: Example) -> Iterator[tuple[int, str]]:
    """Each command line of a shell block with its README line, continuations joined."""
    pending, first = "", 0
    for offset, line in enumerate(example.code.splitlines()):
        if not pending:
            first = example.line + offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        command = pending + line
        if not _quotes_closed(command):  # a quoted value over several lines
            pending = command + "\n"
            continue
        pending = ""
        if command.strip() and not command.lstrip().startswith("#"):
            yield first, command


class Session:
    """The state the README's examples share: database, folder, shell variables, servers."""

    def __init__(self, dsn: str, folder: Path) -> None:
        self.dsn = dsn
        self.folder = folder
        self.variables = folder / ".variables"
        self.variables.write_text("")
        self.env = {key: value for key, value in os.environ.items()
                    if not key.startswith("PG") and key not in ("COURIER_DSN", "DATABASE_URL")}
        # `courier db start` starts an embedded server of the test's own, stopped at the end;
        # `courier demo` makes its database beside COURIER_DSN's under a name of this run's own,
        # as another run may share the server.
        self.env.update(COURIER_DSN=dsn, PATH=f"{BIN}{os.pathsep}{self.env.get('PATH', '')}", COLUMNS="120",
                        PYTHONPATH=str(ROOT), COURIER_DATA_DIR=str(folder / "embedded"),
                        COURIER_DEMO_DATABASE=f"{psycopg.conninfo.conninfo_to_dict(dsn)['dbname']}_demo")
        self.background: list[subprocess.Popen[bytes]] = []
        self.skipped: list[tuple[int, str]] = []

    def fill(self, command: str) -> str:
        for names, query in PLACEHOLDERS.items():
            while any(name in command for name in names):
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    row = conn.execute(query).fetchone()
                assert row is not None and row[0] is not None, f"nothing in the database fills {names} yet"
                for name, value in zip(names, row, strict=True):
                    command = command.replace(name, value, 1)
        return command

    def run_shell(self, line: int, command: str) -> None:
        for prefix, reason in NOT_RUN.items():
            if command.startswith(prefix) or command.strip() == prefix.strip():
                self.skipped.append((line, reason))
                return
        for part in _split_commands(command):
            self._run_one(line, self.fill(part))

    def _run_one(self, line: int, command: str) -> None:
        background = command.startswith(BACKGROUND) or command.endswith("&")
        command = command.removesuffix("&").rstrip()
        script = f"set -a; . {shlex.quote(str(self.variables))}; set -eo pipefail; {command}\n" \
                 f"export -p > {shlex.quote(str(self.variables))}"
        timeout = next((seconds for prefix, seconds in RUN_FOR_SECONDS.items() if command.startswith(prefix)), None)
        if background:
            self._start_background(line, script)
            return
        process = subprocess.Popen(["bash", "-c", script], cwd=self.folder, env=self.env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = process.communicate(timeout=timeout or LINE_SECONDS)
        except subprocess.TimeoutExpired:
            if timeout is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise AssertionError(f"README line {line} did not finish in {LINE_SECONDS} s: {command}") from None
            os.killpg(process.pid, signal.SIGINT)
            out, err = process.communicate(timeout=30)
            # Stopped by SIGINT as a user stops it: a clean exit, not a traceback.
            assert process.returncode in (0, 130, -signal.SIGINT), \
                f"README line {line} ({command}) exited {process.returncode} on SIGINT:\n{err.decode()[-2000:]}"
            return
        assert process.returncode == 0, (f"README line {line} failed ({process.returncode}): {command}\n"
                                         f"stdout: {out.decode()[-2000:]}\nstderr: {err.decode()[-2000:]}")
        assert b"Traceback" not in err, f"README line {line} printed a traceback:\n{err.decode()[-2000:]}"

    def _start_background(self, line: int, script: str) -> None:
        process = subprocess.Popen(["bash", "-c", script.replace("\nexport -p", "\n: ")], cwd=self.folder,
                                   env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   start_new_session=True)
        self.background.append(process)
        listen = re.search(r"--listen (\S+)", script)
        address = listen.group(1).replace("0.0.0.0", "127.0.0.1") if listen else "127.0.0.1:8080"
        scheme = "https" if "--tls-cert" in script else "http"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            probe = subprocess.run(["curl", "-sfk", f"{scheme}://{address}/healthz"], capture_output=True)
            if probe.returncode == 0:
                return
            assert process.poll() is None, f"README line {line} exited: {process.stderr.read().decode()[-2000:]}"
            time.sleep(0.2)
        raise AssertionError(f"README line {line}: {address} did not answer within 30 s")

    def run_sql(self, example: Example) -> None:
        try:
            done = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-q", self.dsn], input=example.code.encode(),
                                  cwd=self.folder, env=self.env, capture_output=True, timeout=LINE_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"README SQL block at line {example.line} did not finish in {LINE_SECONDS} s") \
                from None
        assert done.returncode == 0, (f"README SQL block at line {example.line} failed:\n"
                                      f"{done.stderr.decode()[-2000:]}")

    def run_python(self, example: Example) -> None:
        """A block whose first line names its file (`# consume_orders.py`) is saved under that
        name for the shell lines after it to run; any other runs at once, as a program."""
        named = PROGRAM_NAME.match(example.code)
        if named:
            (self.folder / named.group(1)).write_text(example.code)
            return
        program = self.folder / f"example_{example.line}.py"
        program.write_text(example.code)
        process = subprocess.Popen([sys.executable, str(program)], cwd=self.folder, env=self.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:  # a consumer runs until stopped: give it SIGINT
            os.killpg(process.pid, signal.SIGINT)
            out, err = process.communicate(timeout=30)
        assert process.returncode in (0, 130, -signal.SIGINT), (
            f"README Python block at line {example.line} exited {process.returncode}:\n{err.decode()[-3000:]}")
        assert b"Traceback" not in err, f"README Python block at line {example.line}:\n{err.decode()[-3000:]}"
        self.python_output = out.decode()

    def close(self) -> None:
        subprocess.run([str(BIN / "courier"), "db", "stop"], env=self.env, capture_output=True, timeout=60)
        with psycopg.connect(self.dsn, autocommit=True) as conn:  # in case a demo was cut short
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(self.env["COURIER_DEMO_DATABASE"])))
        for process in self.background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def free_ports(wanted: tuple[int, ...]) -> dict[int, int]:
    """A free loopback port for each of wanted (all bound at once, so they differ)."""
    sockets = []
    try:
        for _ in wanted:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return {port: sock.getsockname()[1] for port, sock in zip(wanted, sockets, strict=True)}
    finally:
        for sock in sockets:
            sock.close()


def on_ports(text: str, ports: dict[int, int]) -> str:
    """text with 127.0.0.1:PORT moved to ports[PORT] where ports has it (line numbers kept)."""
    return LOCAL_ADDRESS.sub(lambda match: str(ports.get(int(match.group(1)), match.group(1))), text)


def _quotes_closed(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:
        return False
    return True


def _split_commands(command: str) -> list[str]:
    """`a ; b` as two commands (so a long-running `a` is bounded alone), unless `;` is quoted."""
    parts, current, quote, escaped = [], "", None, False
    for char in command:
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (not current or current[-1].isspace()):
            break  # a comment: the rest of the line is prose
        elif char == ";":
            parts.append(current.strip())
            current = ""
            continue
        current += char
    parts.append(current.strip())
    return [part for part in parts if part]


@pytest.mark.timeout(README_SECONDS)
def test_every_readme_example_runs_as_written(empty_dsn: str, tmp_path: Path) -> None:
    for name, content in FILES.items():
        (tmp_path / name).write_bytes(content)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", "key.pem", "-out", "cert.pem"], cwd=tmp_path, check=True, capture_output=True)
    session = Session(empty_dsn, tmp_path)
    ports = free_ports(LOCAL_PORTS)
    readme = on_ports(README.read_text(), ports)
    ran, at = 0, "the start"
    try:
        for example in examples(readme):
            if example.language == "sh":
                for line, command in shell_lines(example):
                    at = f"README line {line}: {command}"
                    session.run_shell(line, command)
                    ran += 1
            elif example.language == "sql":
                at = f"README SQL block at line {example.line}"
                session.run_sql(example)
                ran += 1
            else:
                at = f"README Python block at line {example.line}"
                session.run_python(example)
                ran += 1
    except BaseException as stopped:  # pytest-timeout's stop too, which would otherwise name no line
        stopped.add_note(f"while running {at} ({ran} examples done)")
        print(f"stopped while running {at} ({ran} examples done)")
        raise
    finally:
        session.close()
    print(f"{ran} README examples ran; not run: {session.skipped}")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        # The consumer programs took the messages enqueued for them.
        waiting = conn.execute("""
            SELECT count(*) FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id
            WHERE e.name = 'orders' AND q.payload ->> 'id' IN ('44', '45')""").fetchone()
        assert waiting == (0,)
        # The worker delivered billing's messages to `courier sink`, and flaky's failed into the DLQ.
        delivered = conn.execute("""
            SELECT count(*) FROM courier.archive a JOIN courier.endpoints e ON e.id = a.endpoint_id
            WHERE e.name = 'billing' AND a.status = 'completed'""").fetchone()
        assert delivered is not None and delivered[0] >= 2
        dead = conn.execute("SELECT count(*) FROM courier.dlq d JOIN courier.endpoints e ON e.id = d.endpoint_id "
                            "WHERE e.name = 'flaky'").fetchone()
        assert dead is not None and dead[0] >= 1
    assert ran > 50
    # Only what NOT_RUN declares was left out.
    assert {reason for _, reason in session.skipped} <= set(NOT_RUN.values())


def test_readme_servers_move_to_free_ports() -> None:
    ports = free_ports(LOCAL_PORTS)
    assert len(set(ports.values())) == len(LOCAL_PORTS)
    moved = on_ports("courier serve --listen 127.0.0.1:8080 & curl http://127.0.0.1:8080/x "
                     "redis://127.0.0.1:6379/0 http://127.0.0.1:9000/hook", ports)
    assert moved == (f"courier serve --listen 127.0.0.1:{ports[8080]} & curl http://127.0.0.1:{ports[8080]}/x "
                     f"redis://127.0.0.1:6379/0 http://127.0.0.1:{ports[9000]}/hook")


@pytest.mark.parametrize("text, expected", [
    ("a ; b", ["a", "b"]), ("a 'x;y' ; b", ["a 'x;y'", "b"]), ("a  # x; y", ["a"]), ("a#b", ["a#b"]),
 ('a "{\\"x\\":1}"', ['a "{\\"x\\":1}"'])])
def test_commands_split_on_unquoted_semicolons(text: str, expected: list[str]) -> None:
    assert _split_commands(text) == expected
