"""Python consumers of pull topics, over the SQL API (courier.dequeue/ack/nack/extend_lease and
courier.peek/receive), with psycopg's asyncio connections.

- `Consumer`: an async iterator of leased messages (queue-ti's model). A heartbeat task
  extends the lease of every message handed out and not yet acked or nacked, so long work is
  not redelivered to someone else; ack and nack take one message or a batch. A topic's dead
  letters are consumed the same way, as the topic `<topic>.dlq`.
- `ReceiveLoop`: NServiceBus's peek and receive modes. It peeks (courier.peek) every
  `peek_interval`; when messages are waiting up to `concurrency` slots receive them, each a
  destructive courier.receive of one message in a transaction that commits only when the
  handler returns; a receive that comes back empty sends it back to peeking.
  A handler that raises rolls its receive back, and the failure is counted in the database
  (courier.receive_failed): the message waits a growing while, then goes to <topic>.dlq.

Both shut down within a bound: stopping cancels what is still running after the grace
period, and anything not acked (or not committed) comes back to the topic.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format
from psycopg.rows import args_row, dict_row

from . import queries
from .connection import NEW_MESSAGE_CHANNEL, AsyncDatabase
from .errors import CourierError, DatabaseUnavailable, InvalidInput, translated
from .linger import Linger
from .pull import ReceivedMessage
from .stopping import answer_within, cancel_within, within

log = logging.getLogger("courier.consumer")

PEEK_INTERVAL_RANGE = (0.1, 10.0)
"""NServiceBus's recommended peek interval range, in seconds; outside it a warning is logged."""


@dataclass(eq=False)
class PulledMessage:
    """A message dequeued under a lease: ack or nack it with that lease before it runs out."""

    id: int
    lease: int
    payload: Any
    payload_binary: bytes | None
    body: str | None
    metadata: dict[str, Any]
    key: str | None
    retry_count: int
    max_retries: int | None
    created_at: datetime
    visible_until: datetime
    lease_lost: bool = field(default=False, repr=False)
    """Set when a heartbeat found the lease gone: the message is someone else's now."""


_scan_once = json.JSONDecoder().scan_once


def _loads_json_text(text: str) -> Any:
    """A JSON document as PostgreSQL prints it, decoded with one call of the C scanner json.loads
    ends in, without the Python layers around it (json.loads, decode, raw_decode and two
    whitespace matches: about 20% of a consumer's CPU went to decoding payload and metadata).
    Anything the fast path does not take whole goes through json.loads."""
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


class _JsonbBinaryLoader(Loader):
    """jsonb in binary: a format version byte, then the text. One Python call per value rather
    than psycopg's loader calling a loads function (two per row, payload and metadata, were a
    tenth of a consumer's CPU). The empty object, every message's metadata unless the producer
    set some, is not decoded at all."""

    format = Format.BINARY

    def load(self, data: Buffer) -> Any:
        if data == b"\x01{}":
            return {}
        if data[:1] != b"\x01":
            raise psycopg.DataError(f"unknown jsonb binary format: {bytes(data[:1])!r}")
        return _loads_json_text(bytes(data[1:]).decode())


class _JsonbTextLoader(Loader):
    """jsonb in text (the receive loop's client-side cursor), decoded the same way."""

    def load(self, data: Buffer) -> Any:
        return {} if data == b"{}" else _loads_json_text(bytes(data).decode())


async def _configure(conn: psycopg.AsyncConnection) -> None:
    conn.adapters.register_loader("jsonb", _JsonbBinaryLoader)
    conn.adapters.register_loader("jsonb", _JsonbTextLoader)


def _int_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers, for a parameter cast to bigint[] or integer[]:
    psycopg's list dumper matches every element against a quoting regex, a sixth of a
    batch ack's Python time; integers never need quoting."""
    return "{" + ",".join(map(str, values)) + "}"


def _held(batch: list[PulledMessage]) -> dict[str, str]:
    """The ids and leases parameters of the fenced calls (ack, nack, release, extend_lease)."""
    return {"ids": _int_array(m.id for m in batch), "leases": _int_array(m.lease for m in batch)}


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(f"{name} must be a positive number, got {value!r}")


class Consumer:
    """Dequeue from `topic` in batches of `batch_size`, leased for `visibility_timeout`
    seconds and kept leased by a heartbeat every `heartbeat_interval` seconds (a third of
    the timeout by default) for as long as they are neither acked nor nacked.

    Iterating (`async for`, `batches()`) prefetches: while one batch is being worked on, the
    next is already being dequeued, so the work and the database round trips overlap (as an
    AMQP prefetch does). The ack that settles everything handed out takes the batch after
    that in the same statement, so a batch costs one transaction rather than two (a dequeue's
    and an ack's). A prefetched batch is leased and heartbeated like any other; one that is
    never handed out (the loop ends first) is given back on close(), due again within a
    second. `prefetch=False` dequeues only when the next batch is asked for.

    Every database call (dequeue, ack, nack, release, a heartbeat's lease extension) that gets
    no answer within `call_timeout` seconds is cancelled and fails with DatabaseUnavailable,
    rather than hold the consumer until TCP gives up on a database that stopped answering.

        async with Consumer(dsn, "orders") as consumer:
            async for message in consumer:
                await work(message.payload)
                await consumer.ack(message)
    """

    def __init__(self, dsn: str, topic: str, *, batch_size: int = 10, visibility_timeout: int = 30,
                 heartbeat_interval: float | None = None, poll_interval: float = 1.0,
                 shutdown_timeout: float = 5.0, prefetch: bool = True, call_timeout: float = 30.0) -> None:
        if not isinstance(prefetch, bool):
            raise InvalidInput(f"prefetch must be True or False, got {prefetch!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
            raise InvalidInput(f"batch_size must be an integer from 1 to 10000, got {batch_size!r}")
        if isinstance(visibility_timeout, bool) or not isinstance(visibility_timeout, int) \
                or not 1 <= visibility_timeout <= 43_200:
            raise InvalidInput(f"visibility_timeout must be whole seconds from 1 to 43200, got {visibility_timeout!r}")
        heartbeat = visibility_timeout / 3 if heartbeat_interval is None else heartbeat_interval
        for name, value in (("heartbeat_interval", heartbeat), ("poll_interval", poll_interval),
                            ("shutdown_timeout", shutdown_timeout), ("call_timeout", call_timeout)):
            _check_positive(name, value)
        if heartbeat >= visibility_timeout:
            raise InvalidInput(f"heartbeat_interval ({heartbeat:g} s) must be shorter than the visibility "
                               f"timeout ({visibility_timeout} s), or leases run out between heartbeats")
        self.topic = topic
        self.batch_size = batch_size
        self.visibility_timeout = visibility_timeout
        self.heartbeat_interval = heartbeat
        self.poll_interval = poll_interval
        self.shutdown_timeout = shutdown_timeout
        self.call_timeout = call_timeout
        self.prefetch = prefetch
        # One connection acks (and dequeues), kept between calls; one prefetches the next batch
        # meanwhile, one heartbeats (never queued behind a dequeue), one more for acks at once.
        self._db = AsyncDatabase(dsn, min_size=2, max_size=4 if prefetch else 3,
                                 application_name="courier-consumer", configure=_configure,
                                 check=True)  # cheap: borrowed only beside the kept connection
        self._in_flight: dict[int, PulledMessage] = {}
        self._handed_out: set[int] = set()  # by batches(), and not yet settled
        # Batches leased ahead, in the order they are handed out; None where an ack's dequeue
        # failed with it, for the loop to dequeue afresh.
        self._ahead: collections.deque[asyncio.Future[list[PulledMessage] | None]] = collections.deque()
        self._iterating = False
        self._giving_back = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._topic_id: int | None = None  # the id its notifications carry, once known
        self.heartbeats = 0
        """Lease extensions sent so far (one per heartbeat that had messages to extend)."""

    async def __aenter__(self) -> Consumer:
        await self._db.open()
        try:
            self._topic_id = (await self._fetch("consumer_topic_id", {"topic": self.topic}))[0][0]
        except BaseException:
            await within(self.shutdown_timeout, self._db.close(), "closing the connections")
            raise
        self._tasks = [asyncio.create_task(self._heartbeat(), name=f"courier-heartbeat-{self.topic}"),
                       asyncio.create_task(self._listen(), name=f"courier-listen-{self.topic}")]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the heartbeat and listener and close the connections, each within shutdown_timeout.
        Messages still in flight are not acked: they come back when their leases run out. A
        prefetched batch that was never handed out comes back within a second."""
        await within(self.shutdown_timeout, self._give_back_prefetched(), "giving back the prefetched batch")
        await cancel_within(self._tasks, self.shutdown_timeout)
        self._tasks = []
        await within(self.shutdown_timeout, self._db.close(), "closing the connections")

    @property
    def in_flight(self) -> list[PulledMessage]:
        """Messages handed out (or buffered) and not yet acked or nacked."""
        return list(self._in_flight.values())

    async def dequeue(self, count: int | None = None) -> list[PulledMessage]:
        """One courier.dequeue call: up to `count` (default batch_size) messages, now in flight."""
        # Rows straight into PulledMessage (the query's columns are its fields, in order).
        messages: list[PulledMessage] = await self._fetch(
            "consumer_dequeue", {"topic": self.topic, "count": count or self.batch_size,
                                 "visibility_timeout": self.visibility_timeout},
            binary=True, row_factory=args_row(PulledMessage))
        for message in messages:
            self._in_flight[message.id] = message
        return messages

    async def __aiter__(self) -> AsyncIterator[PulledMessage]:
        async for batch in self.batches():
            for message in batch:
                if message.id in self._in_flight:  # not lost to a failed heartbeat meanwhile
                    yield message

    async def batches(self) -> AsyncIterator[list[PulledMessage]]:
        """Each non-empty dequeue as one list, for consumers that work and ack in batches;
        between empty dequeues it waits for a new-message notification or poll_interval. An
        empty dequeue after a notification lingers (sqlkit/linger.py): it looks again within
        milliseconds while producers of the topic are still committing."""
        self._iterating = True
        linger = Linger()
        try:
            while True:
                if self._wake.is_set():
                    linger.start()
                self._wake.clear()
                if self._ahead:
                    # Shielded: a consumer cancelled here leaves the prefetch to finish, so that
                    # the finally below can give its batch back rather than strand its leases.
                    batch = await asyncio.shield(self._ahead[0])
                    self._ahead.popleft()
                    if batch is None:
                        batch = await self.dequeue()
                else:
                    batch = await self.dequeue()
                if batch:
                    if self.prefetch and not self._ahead:  # else an ack already took the next
                        self._ahead.append(asyncio.create_task(self.dequeue(), name=f"courier-prefetch-{self.topic}"))
                    self._handed_out.update(m.id for m in batch)
                    yield batch
                    continue
                if self._ahead:  # an ack's dequeue, behind a prefetch that found the topic empty
                    continue
                pause = await self._linger_pause(linger)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_interval if pause is None else pause)
        finally:
            self._iterating = False
            # Bounded: a database that stopped answering holds neither the prefetch nor its
            # release for long. The leases of a batch not given back run out instead.
            await within(self.shutdown_timeout, self._give_back_prefetched(), "giving back the prefetched batch")

    async def _linger_pause(self, linger: Linger) -> float | None:
        """After an empty dequeue: the pause before the linger's next one, or None if the loop
        is not lingering (any more) and waits for a wake-up or the poll."""
        if not linger.asks():
            return None
        try:
            rows = await self._fetch("topic_sends_committing", {"topic": self.topic})
        except CourierError as error:  # the poll still finds whatever the linger would have
            log.debug("%s: linger check failed: %s", self.topic, error)
            linger.stop()
            return None
        return linger.next_pause(bool(rows[0][0]))

    async def _give_back_prefetched(self) -> None:
        """Batches dequeued ahead and never handed out go back as they were (courier.release):
        due again at once, no attempt counted, rather than after the visibility timeout. Held
        under a lock: close() waits for a loop that is giving its batches back as it ends."""
        async with self._giving_back:
            while self._ahead:
                ahead = self._ahead.popleft()
                try:
                    batch = await ahead
                except Exception:  # the prefetch failed: nothing was leased, nothing to give back
                    continue
                if batch:  # None: an ack's failed dequeue, which leased nothing
                    await self.release(batch)

    async def release(self, messages: PulledMessage | Iterable[PulledMessage]) -> dict[int, str]:
        """Give messages back untouched (never worked on): due again at once, no attempt
        counted; each id's result is 'released', 'lease_lost' or 'not_found'."""
        return await self._settle("consumer_release", messages, {})

    async def ack(self, messages: PulledMessage | Iterable[PulledMessage]) -> dict[int, str]:
        """Ack one message or a batch in one call; returns each id's result: 'acked', or
        'lease_lost' (redelivered to someone else: not applied) or 'not_found'."""
        # The query returns only the ids that were not acked: a batch's worth of 'acked' rows
        # is most of what an ack would otherwise send back and decode.
        batch = [messages] if isinstance(messages, PulledMessage) else list(messages)
        if self._carries_a_dequeue(batch):
            return await self._ack_and_dequeue_ahead(batch)
        return await self._settle("consumer_ack", batch, {}, assumed="acked")

    def _carries_a_dequeue(self, batch: list[PulledMessage]) -> bool:
        """Whether this ack takes the batch after the next one in its own statement: it settles
        everything handed out, while the loop has at most the next batch ahead. Acks of single
        messages carry none until the batch's last."""
        return (self.prefetch and self._iterating and bool(batch) and len(self._ahead) <= 1
                and self._handed_out <= {m.id for m in batch})

    async def _ack_and_dequeue_ahead(self, batch: list[PulledMessage]) -> dict[int, str]:
        """The ack and a dequeue in one statement; the dequeued batch joins those ahead."""
        carried: asyncio.Future[list[PulledMessage] | None] = asyncio.get_running_loop().create_future()
        before = self._ahead[-1] if self._ahead else None
        self._ahead.append(carried)
        self._forget(batch)
        params = {**_held(batch), "topic": self.topic, "count": self.batch_size,
                  "visibility_timeout": self.visibility_timeout}
        try:
            if before is not None and not before.done():
                # The batch ahead is handed out first, so it is dequeued first: the carried one
                # would otherwise take the messages at the head of the topic from under it.
                await asyncio.wait([before])
            rows = await self._fetch("consumer_ack_and_dequeue", params, binary=True)
        except (CourierError, psycopg.Error) as error:
            carried.set_result(None)
            if isinstance(error, DatabaseUnavailable):  # it may have landed: not sent again
                raise
            # The statement rolled back as a whole: the ack on its own, so that it never fails
            # for the dequeue's sake.
            log.debug("%s: ack with the next dequeue failed (%s); acking on its own", self.topic, error)
            return await self._settle("consumer_ack", batch, {}, assumed="acked")
        else:
            dequeued = [PulledMessage(*row[1:]) for row in rows if row[0] is None]
            for message in dequeued:
                self._in_flight[message.id] = message
            carried.set_result(dequeued)
            return self._results(batch, [(row[1], row[0]) for row in rows if row[0] is not None], "acked")
        finally:
            if not carried.done():  # cancelled: the loop dequeues afresh
                carried.set_result(None)

    async def nack(self, messages: PulledMessage | Iterable[PulledMessage], error: str | None = None,
                   delay_seconds: int = 0) -> dict[int, str]:
        """Give messages back for a retry (or the DLQ once out of retries), with the error: due
        again after `delay_seconds` (0 to 43,200), the attempt counted."""
        return await self._settle("consumer_nack", messages, {"error": error, "delay_seconds": delay_seconds})

    async def snooze(self, messages: PulledMessage | Iterable[PulledMessage], delay_seconds: int) -> dict[int, str]:
        """Give messages back to be taken again after `delay_seconds` (0 to 43,200), no attempt
        counted and no error recorded (River's snooze): for work that waits on something else."""
        return await self._settle("consumer_snooze", messages, {"delay_seconds": delay_seconds})

    async def _settle(self, query: str, messages: PulledMessage | Iterable[PulledMessage],
                      extra: dict[str, Any], assumed: str | None = None) -> dict[int, str]:
        batch = [messages] if isinstance(messages, PulledMessage) else list(messages)
        if not batch:
            return {}
        self._forget(batch)
        returned: list[tuple[int, str]] = await self._fetch(query, {**_held(batch), **extra})
        return self._results(batch, returned, assumed)

    def _forget(self, batch: list[PulledMessage]) -> None:
        """No more heartbeats for these, whatever the outcome of settling them."""
        for message in batch:
            self._in_flight.pop(message.id, None)
            self._handed_out.discard(message.id)

    def _results(self, batch: list[PulledMessage], returned: list[tuple[int, str]],
                 assumed: str | None) -> dict[int, str]:
        results = dict.fromkeys((m.id for m in batch), assumed) if assumed else {}
        results.update(returned)
        lost = [i for i, result in results.items() if result == "lease_lost"]
        if lost:
            log.warning("%s: %d message(s) had been redelivered to another consumer; not applied: %s",
                        self.topic, len(lost), lost)
        return results

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self.extend_leases()
            except Exception as error:  # a dropped connection must not end the heartbeats
                log.warning("%s: lease extension failed, will retry: %s", self.topic, error)

    async def extend_leases(self) -> None:
        """Extend the lease of every message in flight by the visibility timeout (what the
        heartbeat does); a message whose lease is gone is dropped from the in-flight set."""
        batch = list(self._in_flight.values())
        if not batch:
            return
        rows: list[dict[str, Any]] = await self._fetch("consumer_extend_lease", {
            **_held(batch), "visibility_timeout": self.visibility_timeout}, row_factory=dict_row)
        self.heartbeats += 1
        by_id = {m.id: m for m in batch}
        for row in rows:
            message = by_id.get(row["id"])
            if message is None:
                continue
            if row["result"] == "extended":
                message.visible_until = row["visible_until"]
            elif self._in_flight.pop(row["id"], None) is not None:
                self._handed_out.discard(row["id"])
                message.lease_lost = True
                log.warning("%s: message %d lost its lease (%s); it is another consumer's now",
                            self.topic, row["id"], row["result"])

    async def _fetch(self, query: str, params: dict[str, Any], **cursor_options: Any) -> list[Any]:
        """The rows of one named query, or DatabaseUnavailable after call_timeout."""
        async def rows() -> list[Any]:
            async with self._db.kept_connection() as conn, conn.cursor(**cursor_options) as cur:
                with translated():
                    await cur.execute(queries.query(query), params)
                    return await cur.fetchall()

        return await answer_within(self.call_timeout, rows(), f"{self.topic}: {query.removeprefix('consumer_')}")

    async def _listen(self) -> None:
        """Wake an idle iterator on the topic's new-message notifications (on every endpoint's
        while its id is unknown: the topic did not exist when the consumer opened); polling every
        poll_interval covers any that are missed. A `<topic>.dlq` has no notifications (a message
        is dead-lettered by a nack or a lapsed lease, not sent): its consumer polls."""
        if self.topic.endswith(".dlq"):
            return
        mine = str(self._topic_id) if self._topic_id is not None else None
        while True:
            try:
                async with self._db.listen(NEW_MESSAGE_CHANNEL) as notes:
                    async for payload in notes:
                        if mine is None or payload == mine or not payload.isdigit():
                            self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.debug("%s: LISTEN connection lost (%s); polling until it is back", self.topic, error)
                await asyncio.sleep(self.poll_interval)


Handler = Callable[[ReceivedMessage], Awaitable[None]]


class _Round:
    """One receive round's budget of receives, shared by its slots, and whether it is over (a
    receive came back empty, or one failed)."""

    def __init__(self, attempts: int) -> None:
        self._left = attempts
        self._over = False

    def take(self) -> bool:
        if self._over or self._left <= 0:
            return False
        self._left -= 1
        return True

    def finish(self) -> None:
        self._over = True


class ReceiveLoop:
    """NServiceBus's peek/receive loop over courier.peek and courier.receive.

    In peek mode it asks courier.peek(topic) for the number of pending messages every
    `peek_interval` seconds (1 s by default; a warning is logged outside 100 ms to 10 s).
    When some are waiting it switches to receive mode: up to that many receives (at most
    `max_records_to_peek`) by at most `concurrency` slots at once. Each receive takes one
    message in a transaction, awaits `handler(message)` and commits (the commit travels
    with the slot's next receive, one round trip per message): a handler that raises rolls
    the receive back and the message stays in the topic. A receive that comes back empty
    (another instance got there first) stops the round; when the round's slots are done it
    peeks again at once. A message whose handler raised is put back, held
    back for a growing while (courier.receive_failed), and dead-lettered to <topic>.dlq past
    the topic's max_retries, so it never blocks the messages behind it. A peek or receive that
    gets no answer within `call_timeout` seconds is cancelled and the loop goes back to
    peeking; an unanswered receive rolls back, so its message is not lost.
    """

    def __init__(self, dsn: str, topic: str, handler: Handler, *, peek_interval: float = 1.0,
                 max_records_to_peek: int = 100, concurrency: int | None = None,
                 shutdown_timeout: float = 10.0, call_timeout: float = 30.0) -> None:
        for name, value in (("peek_interval", peek_interval), ("shutdown_timeout", shutdown_timeout),
                            ("call_timeout", call_timeout)):
            _check_positive(name, value)
        concurrency = max(2, os.cpu_count() or 1) if concurrency is None else concurrency
        for name, value in (("max_records_to_peek", max_records_to_peek), ("concurrency", concurrency)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
                raise InvalidInput(f"{name} must be an integer from 1 to 10000, got {value!r}")
        low, high = PEEK_INTERVAL_RANGE
        if not low <= peek_interval <= high:
            log.warning("peek_interval %g s is outside the recommended %g-%g s: shorter puts needless load "
                        "on the database, longer lets messages back up in the topic", peek_interval, low, high)
        self.topic = topic
        self.handler = handler
        self.peek_interval = peek_interval
        self.max_records_to_peek = max_records_to_peek
        self.concurrency = concurrency
        self.shutdown_timeout = shutdown_timeout
        self.call_timeout = call_timeout
        # Checked before lending: a slot holds its connection for a whole round, so the check
        # is one round trip a round, and a connection that died idle never fails a round.
        self._db = AsyncDatabase(dsn, min_size=1, max_size=concurrency + 1, application_name="courier-receiver",
                                 configure=_configure, check=True)
        self._stopping = asyncio.Event()
        # Messages whose handler failed, by id, until their failure is recorded: set then.
        self._recording: dict[int, asyncio.Event] = {}
        self.received = 0
        self.failed = 0
        self.peeks = 0

    def stop(self) -> None:
        """Ask run() to finish: no new receives; running handlers get shutdown_timeout."""
        self._stopping.set()

    async def run(self) -> None:
        """Peek and receive until stop(); returns within three shutdown_timeouts of it (the
        handlers' grace period, their cancellation, closing the connections), whatever the
        database does."""
        await self._db.open()
        work = asyncio.create_task(self._peek_and_receive(), name=f"courier-receive-loop-{self.topic}")
        try:
            await self._until_stopped_or_done(work)
            if not work.done():  # stopping: a round in progress ends within its grace period
                await within(2 * self.shutdown_timeout, work, "the receive round")
            elif not work.cancelled() and work.exception() is not None:
                raise work.exception()
        finally:
            work.cancel()
            await within(self.shutdown_timeout, self._db.close(), "closing the connections")

    async def _peek_and_receive(self) -> None:
        while not self._stopping.is_set():
            try:
                pending = await self._peek()
            except CourierError as error:  # database away: keep peeking at the interval
                log.warning("%s: peek failed: %s", self.topic, error)
                pending = 0
            if pending > 0:
                failed_before = self.failed
                await self._receive_round(min(pending, self.max_records_to_peek))
                if self.failed == failed_before:
                    continue  # a clean round: peek again at once
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.peek_interval)

    async def _peek(self) -> int:
        """courier.peek, or DatabaseUnavailable after call_timeout (the loop peeks again later)."""
        self.peeks += 1

        async def ask() -> int:
            async with self._db.connection() as conn:
                return int(await queries.fetch_value_async(conn, "consumer_peek", {"topic": self.topic}) or 0)

        async def peek() -> int:
            try:
                return await ask()
            except DatabaseUnavailable:
                # A connection killed after the pool checked it (a restart, pg_terminate_backend
                # between the check and the query) fails its first use. A peek changes nothing,
                # so it asks once more, on a connection the pool lends anew.
                return await ask()

        return await answer_within(self.call_timeout, peek(), f"{self.topic}: peek")

    async def _receive_round(self, attempts: int) -> None:
        """Up to `attempts` receives by at most `concurrency` slots, until one comes back empty;
        returns when all of them are done, or within the grace period once stop() is called
        (even while every slot is held by a slow handler)."""
        round_ = _Round(attempts)
        slots = {asyncio.create_task(self._receive_slot(round_), name=f"courier-receive-{self.topic}")
                 for _ in range(min(self.concurrency, attempts))}
        await self._until_stopped_or_done(asyncio.gather(*slots, return_exceptions=True))
        running = {slot for slot in slots if not slot.done()}
        if running:  # stopping: the handlers get the grace period, then are cancelled
            _, late = await asyncio.wait(running, timeout=self.shutdown_timeout)
            for slot in late:
                slot.cancel()
            if late:
                await asyncio.wait(late, timeout=self.shutdown_timeout)

    async def _until_stopped_or_done(self, work: asyncio.Future[Any]) -> None:
        """Wait until `work` is done or stop() is called, whichever comes first."""
        stop_wait = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({work, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()

    async def _receive_slot(self, round_: _Round) -> None:
        """One slot's receives, one transaction each around the handler, on one connection. A
        handled message's COMMIT travels with the slot's next BEGIN and receive, so a message
        costs one round trip, not two (the receive's own, and its commit's)."""
        try:
            async with self._db.connection() as conn:
                handled: ReceivedMessage | None = None  # its transaction awaits its COMMIT
                try:
                    while round_.take() and not self._stopping.is_set():
                        committing, handled = handled, None
                        message = await answer_within(self.call_timeout,
                                                      self._commit_and_receive(conn, committing, round_),
                                                      f"{self.topic}: receive")
                        if message is None:
                            return
                        recorded = self._recording.get(message.id)
                        if recorded is not None:
                            # Another slot failed on it and waits to record that: give it back
                            # untouched (no attempt), and take nothing more until it is recorded.
                            await conn.execute("ROLLBACK")
                            await recorded.wait()
                            continue
                        try:
                            await self.handler(message)
                        except Exception as error:  # its receive rolls back: the message stays
                            self.failed += 1
                            log.exception("%s: handler failed on message %s", self.topic, message.id)
                            await self._report_failure(conn, message.id, f"{type(error).__name__}: {error}")
                            continue
                        handled = message
                except BaseException:  # cancelled (stop) or the connection failed: nothing commits
                    handled = None
                    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        with contextlib.suppress(psycopg.Error):
                            await conn.execute("ROLLBACK")
                    raise
                finally:
                    if handled is not None:
                        await conn.execute("COMMIT")
                        self.received += 1
        except asyncio.CancelledError:
            raise
        except (CourierError, psycopg.Error) as error:
            self.failed += 1
            round_.finish()  # back to peek mode, which waits before the next round
            log.warning("%s: receive failed: %s", self.topic, error)

    async def _commit_and_receive(self, conn: psycopg.AsyncConnection, committing: ReceivedMessage | None,
                                  round_: _Round) -> ReceivedMessage | None:
        """COMMIT the handled message's transaction (if any), BEGIN the next and receive one
        message in it, as one query; None (rolled back, round over) when the topic is empty."""
        statements = ("COMMIT; " if committing else "") + "BEGIN; " + queries.query("consumer_receive")
        try:
            # Client-side binding: psycopg quotes the parameters into the text, the only way
            # several statements go in one query (server-side binding takes one statement).
            async with psycopg.AsyncClientCursor(conn, row_factory=args_row(ReceivedMessage)) as cur:
                with translated():
                    await cur.execute(statements, {"topic": self.topic, "count": 1})
                while cur.nextset():
                    pass  # to the receive's rows, past COMMIT's and BEGIN's command results
                message = await cur.fetchone()
        except (CourierError, psycopg.Error):
            # In a failed transaction block: BEGIN ran, so the COMMIT before it went through.
            if committing and conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                self.received += 1
            elif committing:
                log.warning("%s: commit of message %s failed; it stays in the topic", self.topic, committing.id)
            raise
        if committing:
            self.received += 1
        if message is None:
            await conn.execute("ROLLBACK")
            round_.finish()
        return message

    async def _report_failure(self, conn: psycopg.AsyncConnection, message_id: int, error: str) -> None:
        """Roll the receive back, so that the message is in the topic again, and count the
        attempt (courier.receive_failed: it holds the message back for a while, or dead-letters
        it, so that it never blocks the messages behind it), in one query. courier.lock_received
        first waits for any receiver that took the message since the rollback, so the failure is
        recorded whatever happens in between, and no other slot of this loop handles the message
        until it is (see _receive_slot)."""
        recorded = self._recording[message_id] = asyncio.Event()
        statements = ("ROLLBACK; BEGIN; " + queries.query("consumer_lock_received") + " "
                      + queries.query("consumer_receive_failed") + " COMMIT;")
        params = {"topic": self.topic, "id": message_id, "error": error}
        try:
            outcome = await answer_within(self.call_timeout, self._last_value(conn, statements, params),
                                          f"{self.topic}: receive_failed")
        except (CourierError, psycopg.Error) as report_error:
            # The receive is rolled back; the message is in the topic, this attempt not counted.
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK")
            log.warning("%s: could not record the failure of message %s: %s", self.topic, message_id, report_error)
            return
        finally:
            del self._recording[message_id]
            recorded.set()
        if outcome == "dead_lettered":
            log.error("%s: message %s failed past max_retries and went to %s.dlq", self.topic, message_id, self.topic)
        elif outcome == "failed":
            log.error("%s: message %s failed past max_retries; the topic has no DLQ (dlq_threshold 0), so it ended "
                      "failed, in the archive", self.topic, message_id)

    @staticmethod
    async def _last_value(conn: psycopg.AsyncConnection, statements: str, params: dict[str, Any]) -> Any:
        """The value of the last statement of `statements` that returns rows."""
        value = None
        async with psycopg.AsyncClientCursor(conn) as cur:
            with translated():
                await cur.execute(statements, params)
                while True:
                    if cur.description is not None:
                        row = await cur.fetchone()
                        value = None if row is None else row[0]
                    if not cur.nextset():
                        return value
