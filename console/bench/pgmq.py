"""pgmq, the peer `courier bench` measures beside Courier in the same database and the same
rounds: its send and send_batch (enqueue-single, enqueue-batch), its read + delete (leased,
like dequeue + ack) and its pop (destructive, like receive) in `pull`.

pgmq is installed from the SQL-only script its Python package (the `peers` extra) pins, into
the bench's scratch database, as schema `pgmq` next to `courier`. Its messages are rows of
`pgmq.q_<queue>`, preloaded the way the Courier topic is, with one INSERT.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from console import extras
from sqlkit.connection import connect

from .pgbench import run_script
from .scratch import in_background

QUEUE = "bench"


def available() -> bool:
    return extras.EXTRAS["peers"].installed()


def version() -> str:
    from pgmq.install import get_embedded_sql_version

    return get_embedded_sql_version()


def install(dsn: str) -> None:
    """pgmq's schema (unless the database has it already) and the bench's queue."""
    from pgmq.install import get_embedded_install_sql

    with connect(dsn) as conn:
        if conn.execute("SELECT to_regnamespace('pgmq') IS NULL").fetchone()[0]:
            with conn.transaction():
                conn.execute(get_embedded_install_sql())
        conn.execute("SELECT pgmq.drop_queue(%s) WHERE EXISTS (SELECT FROM pgmq.list_queues() WHERE queue_name = %s)",
                     (QUEUE, QUEUE))
        conn.execute("SELECT pgmq.create(%s)", (QUEUE,))


def empty(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute(f"TRUNCATE pgmq.q_{QUEUE}")


def preload(dsn: str, messages: int) -> None:
    """The queue holds exactly `messages` messages, all visible now, with the Courier topic's payloads."""
    with connect(dsn) as conn:
        conn.execute(f"TRUNCATE pgmq.q_{QUEUE}")
        conn.execute(f"INSERT INTO pgmq.q_{QUEUE} (vt, message) "
                     "SELECT now(), jsonb_build_object('n', g) FROM generate_series(1, %s::int) g", (messages,))
        conn.execute(f"VACUUM ANALYZE pgmq.q_{QUEUE}")


def left(dsn: str) -> int:
    with connect(dsn) as conn:
        return conn.execute(f"SELECT count(*) FROM pgmq.q_{QUEUE}").fetchone()[0]


def read_delete_script(batch: int) -> str:
    """pgmq's lease protocol: read a batch under a visibility timeout, then delete it by id."""
    return f"""
SELECT coalesce(array_agg(msg_id), '{{}}') AS ids FROM pgmq.read('{QUEUE}', 60, {batch}) \\gset
SELECT count(*) FROM pgmq.delete('{QUEUE}', :ids::bigint[]);
"""


@contextlib.contextmanager
def draining(dsn: str) -> Iterator[None]:
    """pgmq's consumer beside the producers, as fast as it can: read 100 under a visibility
    timeout and delete them, in pgbench, for as long as the block runs."""
    def consume(stop: threading.Event) -> None:
        while not stop.is_set():
            run_script(dsn, read_delete_script(100), clients=1, transactions=200)

    with in_background(consume):
        yield


def pop_script(batch: int) -> str:
    """pgmq's destructive take: read and delete in one call."""
    return f"SELECT msg_id, message FROM pgmq.pop('{QUEUE}', {batch});\n"


def send_script(payload: str) -> str:
    return f"SELECT pgmq.send('{QUEUE}', '{payload}'::jsonb);\n"


def send_batch_script(array: str) -> str:
    """`array`: a jsonb[] literal of the batch's payloads."""
    return f"SELECT pgmq.send_batch('{QUEUE}', {array});\n"


def note() -> str:
    return f"pgmq {version()}, its SQL-only install, in this database"
