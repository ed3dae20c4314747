"""Pull topics through SQL: queue-ti's lifecycle, leases, keyed upsert, <topic>.dlq, per-topic limits
and reapers; NServiceBus's destructive receive and peek; LonnyMQ's scheduled, FIFO dequeue."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.types.json import Jsonb

from sqlkit.reaper_schedule import next_run_after, run_delete_reaper_if_scheduled
from tests.helpers import scalar


@pytest.fixture
def orders(conn) -> str:
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    return "orders"


def enqueue(conn, payload, topic: str = "orders", **options) -> int:
    names = ", ".join(f"p_{name} => %({name})s" for name in options)
    params = {"topic": topic, "payload": Jsonb(payload) if payload is not None else None, **options}
    return scalar(conn, f"SELECT courier.enqueue(%(topic)s, %(payload)s{', ' + names if names else ''})", params)


def dequeue(conn, count: int = 1, topic: str = "orders", timeout: int | None = None) -> list[dict]:
    cur = conn.execute("SELECT * FROM courier.dequeue(%s, %s, %s)", (topic, count, timeout))
    columns = [c.name for c in cur.description]
    return [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]


def status(conn, message_id: int) -> str | None:
    return scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (message_id,))


def lapse(conn, message_id: int) -> None:
    """Make a lease's visibility timeout run out now, as if its seconds had passed."""
    conn.execute("UPDATE courier.queue SET visible_at = now() - interval '1 second' WHERE id = %s", (message_id,))


# Lifecycle (queue-ti): every transition ------------------------------------------------------


def test_pending_dequeued_to_processing_then_acked_and_deleted(conn, orders):
    message_id = enqueue(conn, {"n": 1})
    assert status(conn, message_id) == "pending"
    [held] = dequeue(conn, 1)
    assert (held["id"], held["retry_count"], held["payload"]) == (message_id, 0, {"n": 1})
    assert status(conn, message_id) == "processing"
    assert held["visible_until"] > scalar(conn, "SELECT now() + interval '25 seconds'")  # default 30 s
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (message_id, held["lease"])) == "acked"
    assert status(conn, message_id) is None  # queue-ti's "deleted": gone for good
    assert scalar(conn, "SELECT count(*) FROM courier.archive") == 0
    assert dequeue(conn, 1) == []
    assert scalar(conn, "SELECT sum(messages) FROM courier.queue_depth") == 0
    assert scalar(conn, "SELECT sum(total) FROM courier.delivery_totals WHERE outcome = 'delivered'") == 1


def test_nack_with_retries_left_goes_back_to_pending_with_the_error(conn, orders):
    message_id = enqueue(conn, {"n": 1})
    [held] = dequeue(conn)
    assert scalar(conn, "SELECT courier.nack(%s, %s, 'upstream 500')", (message_id, held["lease"])) == "nacked"
    row = conn.execute("SELECT status, retry_count, last_error, error_history -> 0 ->> 'outcome' "
                       "FROM courier.queue WHERE id = %s", (message_id,)).fetchone()
    assert row == ("pending", 1, "upstream 500", "nack")
    [again] = dequeue(conn)
    assert again["id"] == message_id and again["retry_count"] == 1 and again["lease"] not in (0, held["lease"])


def test_nack_past_max_retries_moves_it_to_topic_dlq(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 1}')""")
    message_id = enqueue(conn, {"n": 1}, key="k1", metadata=Jsonb({"m": 1}))
    results = []
    for _ in range(2):
        [held] = dequeue(conn)
        results.append(scalar(conn, "SELECT courier.nack(%s, %s, 'bad')", (message_id, held["lease"])))
    assert results == ["nacked", "dead_lettered"]
    dead = conn.execute("SELECT endpoint_name, original_topic, dlq_moved_at IS NOT NULL, retry_count, max_retries, "
                        "status, key, metadata, jsonb_array_length(error_history) FROM courier.dlq").fetchone()
    assert dead == ("orders", "orders", True, 0, 0, "failed", "k1", {"m": 1}, 2)
    assert scalar(conn, "SELECT status FROM courier.archive WHERE id = %s", (message_id,)) == "failed"
    assert status(conn, message_id) is None
    assert scalar(conn, "SELECT courier.peek('orders.dlq')") == 1


def test_requeue_restores_retries_on_the_original_topic(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 0}')""")
    enqueue(conn, {"n": 1}, payload_binary=b"\x00\x01", body="one")
    [held] = dequeue(conn)
    assert scalar(conn, "SELECT courier.nack(%s, %s)", (held["id"], held["lease"])) == "dead_lettered"
    dlq_id = scalar(conn, "SELECT id FROM courier.dlq")
    conn.execute("""SELECT courier.alter_endpoint('orders', '{"max_retries": 3}')""")
    new_id = scalar(conn, "SELECT courier.requeue(%s)", (dlq_id,))
    [again] = dequeue(conn)
    assert (again["id"], again["retry_count"], again["max_retries"]) == (new_id, 0, 3)
    assert (again["payload_binary"], again["body"]) == (b"\x00\x01", "one")
    assert conn.execute("SELECT status, redriven_message_id FROM courier.dlq").fetchone() == ("redriven", new_id)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="already requeued"):
        conn.execute("SELECT courier.requeue(%s)", (dlq_id,))


def test_ttl_expires_pending_and_processing_then_the_delete_reaper_removes_them(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"message_ttl_seconds": 60}')""")
    pending, held_id, fresh = (enqueue(conn, {"n": n}) for n in range(3))
    [held] = dequeue(conn)
    assert held["id"] == pending
    conn.execute("UPDATE courier.queue SET expires_at = now() - interval '1 second' WHERE id IN (%s, %s)",
                 (pending, held_id))
    assert scalar(conn, "SELECT courier.run_expiry_reaper()") == 2
    assert [status(conn, i) for i in (pending, held_id, fresh)] == ["expired", "expired", "pending"]
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (pending, held["lease"])) == "not_found"
    conn.execute("SELECT courier.archive_completed_messages(0, 100)")  # one expired row moves on
    conn.execute("UPDATE courier.archive SET status = status")  # (no-op: the archive keeps it as expired)
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'expired'") == 2
    assert scalar(conn, "SELECT courier.run_delete_reaper()") == 2
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'expired'") == 0
    assert status(conn, fresh) == "pending"


def test_the_delete_reaper_runs_on_its_interval_setting(conn, orders):
    message_id = enqueue(conn, {"n": 1})
    conn.execute("UPDATE courier.queue SET status = 'expired' WHERE id = %s", (message_id,))
    assert scalar(conn, "SELECT courier.run_delete_reaper_if_due()") == 0  # interval 0: never on its own
    conn.execute("SELECT courier.set_setting('delete_reaper_interval', '3600')")
    assert scalar(conn, "SELECT courier.run_delete_reaper_if_due()") == 1
    second = enqueue(conn, {"n": 2})
    conn.execute("UPDATE courier.queue SET status = 'expired' WHERE id = %s", (second,))
    assert scalar(conn, "SELECT courier.run_delete_reaper_if_due()") == 0  # ran less than an hour ago
    assert status(conn, second) == "expired"


def test_the_reapers_never_change_more_than_their_batch(conn, orders):
    """`id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)` as the inner side of a semi join runs
    again per row and skips what the statement already changed: all of them went in one call."""
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    for n in range(3):
        conn.execute("SELECT courier.send_with_options('hook', %s, p_expires_at := now() + interval '1 hour')",
                     (Jsonb({"n": n}),))
        enqueue(conn, {"n": n})
    conn.execute("UPDATE courier.queue SET expires_at = now() - interval '1 second'")
    assert scalar(conn, "SELECT courier.mark_expired_messages(2)") == 2  # push and pull, pending
    conn.execute("UPDATE courier.queue SET status = 'pending', completed_at = NULL, last_error = NULL "
                 "WHERE status = 'expired'")
    dequeue(conn, 3)
    conn.execute("UPDATE courier.queue SET expires_at = now() - interval '1 second'")
    conn.execute("UPDATE courier.queue SET status = 'expired' WHERE visible_at IS NULL")  # out of the way
    assert scalar(conn, "SELECT courier.run_expiry_reaper(2)") == 2  # pull, processing
    assert scalar(conn, "SELECT courier.run_expiry_reaper(2)") == 1
    assert scalar(conn, "SELECT courier.run_delete_reaper(2)") == 2
    assert scalar(conn, "SELECT courier.run_delete_reaper(2)") == 1
    assert scalar(conn, "SELECT courier.run_delete_reaper(2)") == 0


def _expire_one(conn, n: int) -> int:
    message_id = enqueue(conn, {"n": n})
    conn.execute("UPDATE courier.queue SET status = 'expired' WHERE id = %s", (message_id,))
    return message_id


def test_the_delete_reaper_runs_on_its_cron_schedule(conn, orders):
    """queue-ti's delete_reaper_schedule: once per time the schedule names, counted from the
    last run, or from when the schedule was set; it wins over delete_reaper_interval."""
    conn.execute("SELECT courier.set_setting('delete_reaper_interval', '60')")
    assert scalar(conn, "SELECT courier.set_setting('delete_reaper_schedule', '0 3 * * *')") == "0 3 * * *"
    first = _expire_one(conn, 1)
    assert run_delete_reaper_if_scheduled(conn, 10_000) == 0  # set just now: the next 03:00 is ahead
    assert status(conn, first) == "expired"
    conn.execute("UPDATE courier.settings SET updated_at = now() - interval '2 days' "
                 "WHERE name = 'delete_reaper_schedule'")  # a 03:00 has come since it was set
    assert run_delete_reaper_if_scheduled(conn, 10_000) == 1
    second = _expire_one(conn, 2)
    assert run_delete_reaper_if_scheduled(conn, 10_000) == 0  # ran now: not before the next 03:00
    assert status(conn, second) == "expired"
    conn.execute("UPDATE courier.reaper_runs SET last_run_at = now() - interval '1 day' WHERE reaper = 'delete'")
    assert run_delete_reaper_if_scheduled(conn, 10_000) == 1
    assert status(conn, second) is None


def test_a_cron_schedule_is_read_in_utc_whatever_the_session_time_zone():
    since = datetime(2026, 11, 25, 1, 30, tzinfo=ZoneInfo("Asia/Tokyo"))  # 2026-11-24 16:30 UTC
    assert next_run_after("0 3 * * *", since) == datetime(2026, 11, 25, 3, 0, tzinfo=UTC)
    assert next_run_after("0 0 31 2 *", since) is None


def test_a_delete_reaper_run_that_filled_its_batch_goes_on_at_the_next_check(conn, orders):
    conn.execute("SELECT courier.set_setting('delete_reaper_schedule', '@daily')")
    conn.execute("UPDATE courier.settings SET updated_at = now() - interval '2 days' "
                 "WHERE name = 'delete_reaper_schedule'")
    expired = [_expire_one(conn, n) for n in range(3)]
    assert run_delete_reaper_if_scheduled(conn, 2) == 2  # a full batch: more may be left
    assert run_delete_reaper_if_scheduled(conn, 2) == 1
    assert run_delete_reaper_if_scheduled(conn, 2) == 0
    assert [status(conn, i) for i in expired] == [None, None, None]


@pytest.mark.parametrize("given, stored", [
    ("@daily", "0 0 * * *"), ("@HOURLY", "0 * * * *"), ("  */15   1-5 * *  0,6 ", "*/15 1-5 * * 0,6"),
    ("5/10 0 1 1 7", "5/10 0 1 1 7"), ("", ""),
])
def test_a_cron_schedule_is_stored_normalised(conn, given, stored):
    assert scalar(conn, "SELECT courier.set_setting('delete_reaper_schedule', %s)", (given,)) == stored


@pytest.mark.parametrize("value", ["61 * * * *", "* * * *", "* * * * * *", "daily", "*/0 * * * *",
                                   "5-1 * * * *", "0 0 0 * *", "0 24 * * *", "1,,2 * * * *", "mon * * * *"])
def test_a_cron_schedule_that_is_not_one_is_refused_naming_the_setting(conn, value):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="delete_reaper_schedule must be a cron schedule"):
        conn.execute("SELECT courier.set_setting('delete_reaper_schedule', %s)", (value,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="delete_reaper_schedule"):
        conn.execute("UPDATE courier.settings SET value = %s WHERE name = 'delete_reaper_schedule'", (value,))


@pytest.mark.parametrize("value", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *", "0 0 30-31 2 *",
                                   "0 0 30 2 */2", "0 0 31/2 9 *"])
def test_a_schedule_naming_a_date_that_never_comes_is_refused_naming_the_setting(conn, value):
    """30 February or 31 April: the leader's cronsim finds no time, so the reaper would never run."""
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match="delete_reaper_schedule names a day that never comes"):
        conn.execute("SELECT courier.set_setting('delete_reaper_schedule', %s)", (value,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="delete_reaper_schedule"):
        conn.execute("UPDATE courier.settings SET value = %s WHERE name = 'delete_reaper_schedule'", (value,))
    assert scalar(conn, "SELECT value FROM courier.settings WHERE name = 'delete_reaper_schedule'") == ""


@pytest.mark.parametrize("value", ["0 0 29 2 *", "0 0 31 1-12 *", "0 0 30,1 2 *", "0 0 */30 2 *",
                                   "0 0 30 2 1", "0 0 31 4 1-5"])
def test_a_schedule_whose_day_comes_in_some_month_or_year_is_kept(conn, value):
    """29 February comes in leap years; a restricted day of week (not starting with *) is
    either-or with the day of month, as in cron and cronsim."""
    assert scalar(conn, "SELECT courier.set_setting('delete_reaper_schedule', %s)", (value,)) == value
    assert next_run_after(value, datetime(2026, 1, 1, tzinfo=UTC)) is not None


def test_a_schedule_that_never_comes_runs_nothing_and_says_so(conn, orders, caplog):
    """A value stored before such schedules were refused (set here past the trigger)."""
    conn.execute("ALTER TABLE courier.settings DISABLE TRIGGER settings_validate")
    conn.execute("UPDATE courier.settings SET value = '0 0 31 2 *', updated_at = now() - interval '2 days' "
                 "WHERE name = 'delete_reaper_schedule'")
    conn.execute("ALTER TABLE courier.settings ENABLE TRIGGER settings_validate")
    message_id = _expire_one(conn, 1)
    assert run_delete_reaper_if_scheduled(conn, 10_000) == 0
    assert status(conn, message_id) == "expired"
    assert "names no time" in caplog.text


# Leases and visibility ---------------------------------------------------------------------


def test_visibility_timeout_redelivers_and_a_late_ack_is_refused(conn, orders):
    message_id = enqueue(conn, {"n": 1})
    [first] = dequeue(conn, 1, timeout=1)
    assert dequeue(conn) == []  # invisible while leased
    time.sleep(1.2)
    [second] = dequeue(conn, 1, timeout=30)
    assert second["id"] == message_id and second["lease"] not in (0, first["lease"])
    assert second["retry_count"] == 1  # the lost attempt counts
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (message_id, first["lease"])) == "lease_lost"
    assert scalar(conn, "SELECT courier.nack(%s, %s)", (message_id, first["lease"])) == "lease_lost"
    assert status(conn, message_id) == "processing"  # the new holder's claim is untouched
    stale = scalar(conn, "SELECT sum(total) FROM courier.delivery_totals WHERE outcome = 'stale_report'")
    assert stale == 2
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (message_id, second["lease"])) == "acked"


def test_an_ack_after_the_timeout_but_before_redelivery_still_counts(conn, orders):
    message_id = enqueue(conn, {"n": 1})
    [held] = dequeue(conn)
    lapse(conn, message_id)
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (message_id, held["lease"])) == "acked"
    assert dequeue(conn) == []


def test_batch_ack_gives_one_clear_result_per_id(conn, orders):
    ids = [enqueue(conn, {"n": n}) for n in range(3)]
    held = dequeue(conn, 3)
    lapse(conn, ids[2])
    [taken] = dequeue(conn, 1)  # someone else takes the third
    results = conn.execute("SELECT * FROM courier.ack(%s::bigint[], %s::integer[])",
                           ([ids[0], ids[1], ids[2], 999999, ids[0]],
                            [held[0]["lease"], held[1]["lease"], held[2]["lease"], 1, held[0]["lease"]])).fetchall()
    assert results == [(ids[0], "acked"), (ids[1], "acked"), (ids[2], "lease_lost"), (999999, "not_found"),
                       (ids[0], "acked")]
    assert taken["id"] == ids[2] and status(conn, ids[2]) == "processing"
    again = conn.execute("SELECT * FROM courier.ack(%s::bigint[], %s::integer[])",
                         ([ids[0]], [held[0]["lease"]])).fetchall()
    assert again == [(ids[0], "not_found")]  # already acked


def test_extend_lease_keeps_the_message_invisible_and_only_for_its_holder(conn, orders):
    message_id = enqueue(conn, {"n": 1})
    [held] = dequeue(conn, 1, timeout=5)
    [(_, result, until)] = conn.execute("SELECT * FROM courier.extend_lease(%s::bigint[], %s::integer[], 600)",
                                        ([message_id], [held["lease"]])).fetchall()
    assert result == "extended" and until > held["visible_until"]
    lapse(conn, message_id)
    [other] = dequeue(conn)
    [(_, result, until)] = conn.execute("SELECT * FROM courier.extend_lease(%s::bigint[], %s::integer[], 600)",
                                        ([message_id], [held["lease"]])).fetchall()
    assert (result, until) == ("lease_lost", None)
    assert other["lease"] not in (0, held["lease"])


def test_release_gives_messages_back_untouched_and_only_for_their_holder(conn, orders):
    first, second = enqueue(conn, {"n": 1}), enqueue(conn, {"n": 2})
    held = dequeue(conn, 2)
    lapse(conn, second)
    [taken_over] = dequeue(conn)  # the second's lease ran out and someone else has it now
    results = dict(conn.execute("SELECT * FROM courier.release(%s::bigint[], %s::integer[])",
                                ([first, second, 999_999], [m["lease"] for m in held] + [1])).fetchall())
    assert results == {first: "released", second: "lease_lost", 999_999: "not_found"}
    assert (status(conn, first), status(conn, second)) == ("pending", "processing")
    [again] = dequeue(conn)
    assert (again["id"], again["retry_count"]) == (first, 0)  # no attempt counted, no error
    assert scalar(conn, "SELECT last_error FROM courier.queue WHERE id = %s", (first,)) is None
    assert taken_over["id"] == second
    # The releasing client's lease is spent: its late ack changes nothing.
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (first, held[0]["lease"])) == "lease_lost"


def test_a_message_whose_lease_keeps_running_out_is_dead_lettered(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 1}')""")
    message_id = enqueue(conn, {"n": 1})
    dequeue(conn)
    lapse(conn, message_id)
    assert dequeue(conn)[0]["retry_count"] == 1
    lapse(conn, message_id)
    assert dequeue(conn) == []  # past max_retries: dead-lettered, not handed out a third time
    assert "visibility timeout" in scalar(conn, "SELECT last_error FROM courier.dlq")


def test_a_dead_lettered_lease_in_a_batch_leaves_the_rest_of_the_batch_in_order(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 0}')""")
    first, spent, third = (enqueue(conn, {"n": n}) for n in range(3))
    dequeue(conn, 3)
    conn.execute("UPDATE courier.queue SET status = 'pending', visible_at = now() - interval '1 minute', "
                 "lease = lease + 1 WHERE id IN (%s, %s)", (first, third))
    lapse(conn, spent)  # its one attempt ran out: past max_retries
    assert [m["id"] for m in dequeue(conn, 10)] == [first, third]
    assert scalar(conn, "SELECT original_message_id FROM courier.dlq") == spent
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE id = %s", (spent,)) == 0
    depth = dict(conn.execute("SELECT status, sum(messages)::int FROM courier._depth_by_endpoint() GROUP BY status "
                              "HAVING sum(messages) <> 0").fetchall())
    assert depth == {"processing": 2}


def test_lease_arguments_are_checked(conn, orders):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="lease"):
        conn.execute("SELECT * FROM courier.ack(ARRAY[1, 2]::bigint[], ARRAY[1]::integer[])")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="count"):
        conn.execute("SELECT * FROM courier.dequeue('orders', 0)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="visibility_timeout_seconds"):
        conn.execute("SELECT * FROM courier.dequeue('orders', 1, 0)")


# Keyed upsert ------------------------------------------------------------------------------


def test_a_pending_keyed_message_is_replaced_in_place(conn, orders):
    first = enqueue(conn, {"v": 1}, key="order-42", metadata=Jsonb({"a": 1}))
    second = enqueue(conn, {"v": 2}, key="order-42", metadata=Jsonb({"b": 2}))
    other = enqueue(conn, {"v": 3}, key="order-43")
    assert second == first and other != first
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 2
    [held, _] = dequeue(conn, 2)
    assert (held["id"], held["payload"], held["metadata"], held["key"]) == (first, {"v": 2}, {"b": 2}, "order-42")


def test_a_keyed_message_in_processing_is_never_touched(conn, orders):
    first = enqueue(conn, {"v": 1}, key="order-42")
    [held] = dequeue(conn)
    with pytest.raises(psycopg.errors.UniqueViolation, match="being processed"):
        enqueue(conn, {"v": 2}, key="order-42")
    assert scalar(conn, "SELECT payload FROM courier.queue WHERE id = %s", (first,)) == {"v": 1}
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (first, held["lease"])) == "acked"
    assert enqueue(conn, {"v": 2}, key="order-42") != first  # free again once acked


def test_keyless_messages_always_insert(conn, orders):
    assert len({enqueue(conn, {"v": 1}) for _ in range(3)}) == 3


def test_payloads_binary_metadata_and_body(conn, orders):
    binary = bytes(range(256))
    message_id = enqueue(conn, None, payload_binary=binary, body="invoice #7", metadata=Jsonb({"type": "pdf"}))
    [held] = dequeue(conn)
    assert (held["id"], held["payload"], held["payload_binary"]) == (message_id, None, binary)
    assert (held["body"], held["metadata"]) == ("invoice #7", {"type": "pdf"})
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="payload"):
        enqueue(conn, None)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="metadata"):
        enqueue(conn, {}, metadata=Jsonb([1]))


def test_non_keyed_payloads_stay_immutable(conn, orders):
    message_id = enqueue(conn, {"v": 1})
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="immutable"):
        conn.execute("UPDATE courier.queue SET payload = '{}' WHERE id = %s", (message_id,))


def test_dlq_names_are_reserved_and_push_endpoints_are_not_topics(conn, orders, webhook):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="reserved"):
        enqueue(conn, {}, topic="orders.dlq")
    with pytest.raises(psycopg.errors.WrongObjectType, match="not a pull topic"):
        dequeue(conn, 1, topic="webhook")
    with pytest.raises(psycopg.errors.NoDataFound, match="does not exist"):
        enqueue(conn, {}, topic="nosuch")


# Per-topic configuration, and the same limits on push endpoints ----------------------------


def test_topic_max_retries_overrides_the_global_default_and_falls_back_when_cleared(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_retries": 4}')""")
    conn.execute("SELECT courier.set_setting('default_max_retries', '0')")
    enqueue(conn, {"n": 1})
    [held] = dequeue(conn)
    assert held["max_retries"] == 4
    assert scalar(conn, "SELECT courier.nack(%s, %s)", (held["id"], held["lease"])) == "nacked"
    conn.execute("""SELECT courier.alter_endpoint('orders', '{"max_retries": null}')""")
    [held] = dequeue(conn)
    assert held["max_retries"] == 0
    assert scalar(conn, "SELECT courier.nack(%s, %s)", (held["id"], held["lease"])) == "dead_lettered"


def test_topic_ttl_overrides_the_global_default_and_zero_disables_it(conn):
    conn.execute("SELECT courier.set_setting('default_message_ttl', '60')")
    conn.execute("""SELECT courier.create_endpoint('short', 'pull', '{"message_ttl_seconds": 5}')""")
    conn.execute("""SELECT courier.create_endpoint('forever', 'pull', '{"message_ttl_seconds": 0}')""")
    conn.execute("SELECT courier.create_endpoint('default', 'pull', '{}')")
    ttl = {topic: scalar(conn, "SELECT extract(epoch FROM expires_at - visible_at) FROM courier.queue WHERE id = %s",
                         (enqueue(conn, {}, topic=topic),)) for topic in ("short", "forever", "default")}
    assert ttl == {"short": 5, "forever": None, "default": 60}


def test_max_depth_rejects_with_its_own_sqlstate_and_falls_back_to_the_setting(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"max_depth": 2}')""")
    enqueue(conn, {"n": 1})
    enqueue(conn, {"n": 2}, key="k")
    assert enqueue(conn, {"n": 3}, key="k") > 0  # an upsert in place adds nothing
    with pytest.raises(psycopg.Error, match='"orders" is full') as refused:
        enqueue(conn, {"n": 4})
    assert refused.value.sqlstate == "53401"
    conn.execute("SELECT courier.alter_endpoint('orders', '{}')")
    conn.execute("SELECT courier.set_setting('default_max_depth', '3')")
    enqueue(conn, {"n": 4})
    with pytest.raises(psycopg.Error) as refused:
        enqueue(conn, {"n": 5})
    assert refused.value.sqlstate == "53401"
    [held] = dequeue(conn)
    conn.execute("SELECT courier.ack(%s, %s)", (held["id"], held["lease"]))
    enqueue(conn, {"n": 5})  # room again


def test_throughput_limit_softly_returns_fewer(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"throughput_limit": 5}')""")
    conn.execute("SELECT courier.enqueue('orders', jsonb_build_object('n', g)) FROM generate_series(1, 50) g")
    assert len(dequeue(conn, 100)) == 5  # one second's worth, and no error
    assert len(dequeue(conn, 100)) == 0
    time.sleep(0.5)
    assert 1 <= len(dequeue(conn, 100)) <= 3
    conn.execute("SELECT courier.alter_endpoint('orders', '{}')")  # back to the default: unlimited
    assert len(dequeue(conn, 100)) > 30


def test_the_global_throughput_limit_applies_to_topics_without_their_own(conn, orders):
    conn.execute("SELECT courier.set_setting('default_throughput_limit', '3')")
    conn.execute("SELECT courier.enqueue('orders', jsonb_build_object('n', g)) FROM generate_series(1, 10) g")
    assert len(dequeue(conn, 10)) == 3


def test_the_global_throughput_limit_applies_to_receive_too(conn, orders):
    conn.execute("SELECT courier.set_setting('default_throughput_limit', '3')")
    conn.execute("SELECT courier.enqueue('orders', jsonb_build_object('n', g)) FROM generate_series(1, 10) g")
    assert scalar(conn, "SELECT count(*) FROM courier.receive('orders', 10)") == 3
    conn.execute("SELECT courier.set_setting('default_throughput_limit', '0')")  # 0: no limit again
    assert scalar(conn, "SELECT count(*) FROM courier.receive('orders', 10)") == 7


def test_a_topic_s_own_throughput_limit_binds_receive_over_the_setting(conn):
    conn.execute("""SELECT courier.create_endpoint('limited', 'pull', '{"throughput_limit": 2}')""")
    conn.execute("SELECT courier.create_endpoint('defaulted', 'pull', '{}')")
    conn.execute("SELECT courier.set_setting('default_throughput_limit', '4')")
    for topic in ("limited", "defaulted"):
        conn.execute("SELECT courier.enqueue(%s, jsonb_build_object('n', g)) FROM generate_series(1, 20) g", (topic,))
    assert scalar(conn, "SELECT count(*) FROM courier.receive('limited', 10)") == 2
    assert scalar(conn, "SELECT count(*) FROM courier.receive('defaulted', 10)") == 4


def test_push_endpoints_enforce_max_depth_and_ttl_and_refuse_pull_only_keys(conn):
    conn.execute("""SELECT courier.create_endpoint('hook', 'http',
                    '{"url": "https://h.example/x", "max_depth": 2, "message_ttl_seconds": 30}')""")
    first = scalar(conn, "SELECT courier.send('hook', '{}')")
    assert scalar(conn, "SELECT extract(epoch FROM expires_at - created_at) FROM courier.queue WHERE id = %s",
                  (first,)) == 30
    conn.execute("SELECT courier.send('hook', '{}')")
    for statement in ("SELECT courier.send('hook', '{}')",
                      "SELECT courier.send_batch('hook', ARRAY['{}']::jsonb[])",
                      "SELECT courier.send_with_options('hook', '{}', p_idempotency_key => 'x')"):
        with pytest.raises(psycopg.Error, match="max_depth") as refused:
            conn.execute(statement)
        assert refused.value.sqlstate == "53401"
    explicit = scalar(conn, "SELECT courier.send_with_options('hook', '{}', p_expires_at => now() + interval '1 h')"
                            " FROM (SELECT courier.alter_endpoint('hook', '{\"url\": \"https://h.example/x\"}')) a")
    assert scalar(conn, "SELECT extract(epoch FROM expires_at - created_at) FROM courier.queue WHERE id = %s",
                  (explicit,)) == 3600
    for key, fragment in (("throughput_limit", "rate_limit"), ("max_retries", "retry policy"),
                          ("visibility_timeout", "pull topics only")):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=fragment):
            conn.execute("SELECT courier.create_endpoint('h2', 'http', %s)",
                         (Jsonb({"url": "https://h.example/x", key: 5}),))


def test_the_global_ttl_and_depth_apply_to_push_sends(conn, webhook):
    conn.execute("SELECT courier.set_setting('default_message_ttl', '90')")
    conn.execute("SELECT courier.set_setting('default_max_depth', '1')")
    first = scalar(conn, "SELECT courier.send('webhook', '{}')")
    assert scalar(conn, "SELECT extract(epoch FROM expires_at - created_at) FROM courier.queue WHERE id = %s",
                  (first,)) == 90
    with pytest.raises(psycopg.Error) as refused:
        conn.execute("SELECT courier.send('webhook', '{}')")
    assert refused.value.sqlstate == "53401"


def test_send_to_a_topic_is_dequeued_like_an_enqueue(conn, orders):
    message_id = scalar(conn, "SELECT courier.send('orders', '{\"via\": \"send\"}')")
    batch = scalar(conn, "SELECT courier.send_batch('orders', ARRAY['{\"n\": 1}']::jsonb[])")
    assert [m["id"] for m in dequeue(conn, 5)] == [message_id, *batch]


# Destructive receive and peek (NServiceBus) -------------------------------------------------


def test_receive_deletes_in_fifo_order_and_drops_expired_messages(conn, orders):
    ids = [enqueue(conn, {"n": n}) for n in range(5)]
    conn.execute("UPDATE courier.queue SET expires_at = now() - interval '1 s' WHERE id = %s", (ids[1],))
    assert scalar(conn, "SELECT courier.peek('orders')") == 5
    got = conn.execute("SELECT id, payload FROM courier.receive('orders', 3)").fetchall()
    assert got == [(ids[0], {"n": 0}), (ids[2], {"n": 2}), (ids[3], {"n": 3})]
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 1  # the expired one dropped, not returned
    assert [r[0] for r in conn.execute("SELECT id FROM courier.receive('orders', 10)")] == [ids[4]]
    assert conn.execute("SELECT * FROM courier.receive('orders', 10)").fetchall() == []
    totals = dict(conn.execute("SELECT outcome, sum(total)::int FROM courier.delivery_totals GROUP BY 1").fetchall())
    assert totals["delivered"] == 4 and totals["expired"] == 1


def test_concurrent_receivers_get_nothing_twice_lose_nothing_and_never_more_than_asked(dsn, conn, orders):
    conn.execute("SELECT courier.enqueue('orders', jsonb_build_object('n', g)) FROM generate_series(1, 3000) g")
    wanted = set(r[0] for r in conn.execute("SELECT id FROM courier.queue"))
    got: list[int] = []
    oversized: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def receiver() -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            start.wait()
            while True:
                rows = own.execute("SELECT id FROM courier.receive('orders', 7)").fetchall()
                if len(rows) > 7:
                    oversized.append(len(rows))
                if not rows:
                    return
                with lock:
                    got.extend(r[0] for r in rows)

    threads = [threading.Thread(target=receiver) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert oversized == []
    assert len(got) == len(set(got)) == 3000
    assert set(got) == wanted
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_concurrent_dequeuers_never_share_a_message(dsn, conn, orders):
    conn.execute("SELECT courier.enqueue('orders', jsonb_build_object('n', g)) FROM generate_series(1, 2000) g")
    got: list[int] = []
    lock = threading.Lock()

    def consumer() -> None:
        with psycopg.connect(dsn, autocommit=True) as own:
            while rows := own.execute("SELECT id, lease FROM courier.dequeue('orders', 25)").fetchall():
                assert len(rows) <= 25
                results = own.execute("SELECT result FROM courier.ack(%s::bigint[], %s::integer[])",
                                      ([r[0] for r in rows], [r[1] for r in rows])).fetchall()
                assert {r[0] for r in results} == {"acked"}
                with lock:
                    got.extend(r[0] for r in rows)

    threads = [threading.Thread(target=consumer) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(got) == len(set(got)) == 2000


def test_peek_estimates_due_messages_cheaply(conn, orders):
    assert scalar(conn, "SELECT courier.peek('orders')") == 0
    conn.execute("SELECT courier.enqueue('orders', '{}') FROM generate_series(1, 1500)")
    enqueue(conn, {}, scheduled_at=scalar(conn, "SELECT now() + interval '1 hour'"))
    assert scalar(conn, "SELECT courier.peek('orders')") >= 1500  # beyond 1000: the maintained count


# Scheduling and FIFO (LonnyMQ) ------------------------------------------------------------


def test_fifo_within_one_transactions_batch(dsn, orders):
    with psycopg.connect(dsn) as tx:  # one transaction: one now()
        ids = [enqueue(tx, {"n": n}) for n in range(20)]
        tx.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert [m["id"] for m in dequeue(conn, 20)] == ids
        assert ids == sorted(ids)


def test_scheduled_messages_wait_and_come_in_due_time_then_id_order(conn, orders):
    now = scalar(conn, "SELECT now()")
    later = enqueue(conn, {"n": "later"}, scheduled_at=scalar(conn, "SELECT now() + interval '1.5 seconds'"))
    soon_a = enqueue(conn, {"n": "soon a"}, scheduled_at=scalar(conn, "SELECT now() + interval '0.5 seconds'"))
    soon_b = enqueue(conn, {"n": "soon b"}, scheduled_at=scalar(conn, "SELECT now() + interval '0.5 seconds'"))
    past = enqueue(conn, {"n": "past"}, scheduled_at=now.replace(year=now.year - 1))
    assert [m["id"] for m in dequeue(conn, 10)] == [past]
    assert conn.execute("SELECT * FROM courier.receive('orders', 10)").fetchall() == []
    time.sleep(0.6)
    assert [m["id"] for m in dequeue(conn, 10)] == [soon_a, soon_b]
    time.sleep(1.0)
    assert [m["id"] for m in dequeue(conn, 10)] == [later]


def test_a_disabled_topic_refuses_enqueue_and_hands_out_nothing(conn, orders):
    enqueue(conn, {})
    conn.execute("SELECT courier.disable_endpoint('orders')")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="disabled"):
        enqueue(conn, {})
    assert dequeue(conn) == []
    conn.execute("SELECT courier.enable_endpoint('orders')")
    assert len(dequeue(conn)) == 1


def test_an_enqueue_wakes_consumers_waiting_on_the_topic(dsn, conn, orders):
    """An enqueue sent no NOTIFY (a send to a topic did), so waiting consumers found its messages
    only at their next poll. One replaced in place, due when it was, wakes nobody again; one due
    later wakes nobody yet (tests/test_pull_wakeups.py has the rest)."""
    topic_id = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'orders'")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN courier_new_msg")
        conn.execute("SELECT courier.enqueue('orders', '{\"n\": 1}', p_key => 'k')")
        conn.execute("SELECT courier.enqueue('orders', '{\"n\": 2}', p_key => 'k')")  # replaced in place
        conn.execute("SELECT courier.enqueue('orders', '{\"n\": 3}', p_scheduled_at => now() + interval '1 hour')")
        assert [n.payload for n in listener.notifies(timeout=1)] == [str(topic_id)]


def nack(conn, held: dict, error: str = "boom") -> str:
    return scalar(conn, "SELECT courier.nack(%s, %s, %s)", (held["id"], held["lease"], error))


def test_the_dlq_threshold_moves_a_message_early_and_zero_turns_the_dlq_off(conn):
    """queue-ti's DLQ threshold: a topic's dlq_threshold (else default_dlq_threshold) moves a
    message to <topic>.dlq after that many failed attempts; 0 is no DLQ, and a message past its
    retries ends `failed` in the archive, counted by messages_failed_total."""
    conn.execute("""SELECT courier.create_endpoint('early', 'pull', '{"max_retries": 5, "dlq_threshold": 2}')""")
    conn.execute("""SELECT courier.create_endpoint('nodlq', 'pull', '{"max_retries": 1, "dlq_threshold": 0}')""")
    early = enqueue(conn, {"n": 1}, topic="early")
    assert nack(conn, dequeue(conn, topic="early")[0]) == "nacked"
    assert nack(conn, dequeue(conn, topic="early")[0]) == "dead_lettered"  # 2 attempts, though 5 retries remain
    assert scalar(conn, "SELECT original_message_id FROM courier.dlq WHERE original_topic = 'early'") == early

    failing = enqueue(conn, {"n": 2}, topic="nodlq")
    assert nack(conn, dequeue(conn, topic="nodlq")[0]) == "nacked"
    assert nack(conn, dequeue(conn, topic="nodlq")[0]) == "failed"  # past max_retries, and no DLQ
    assert scalar(conn, "SELECT count(*) FROM courier.dlq WHERE original_topic = 'nodlq'") == 0
    assert scalar(conn, "SELECT status FROM courier.archive WHERE id = %s", (failing,)) == "failed"
    assert status(conn, failing) is None
    failed = scalar(conn, "SELECT metric_value FROM courier.metrics() "
                          "WHERE metric_name = 'messages_failed_total' AND labels ->> 'endpoint' = 'nodlq'")
    assert failed == 1

    # The global threshold, for topics without their own; a lapsed lease counts as an attempt too.
    conn.execute("SELECT courier.set_setting('default_dlq_threshold', '1')")
    conn.execute("SELECT courier.create_endpoint('global', 'pull', '{}')")
    lapsing = enqueue(conn, {"n": 3}, topic="global")
    dequeue(conn, topic="global")
    lapse(conn, lapsing)
    assert dequeue(conn, topic="global") == []
    assert scalar(conn, "SELECT count(*) FROM courier.dlq WHERE original_topic = 'global'") == 1


def test_nack_reads_each_limit_where_the_topic_has_it_else_the_settings(conn):
    """nack's last attempt: the topic's max_retries, else its retry policy's, else
    default_max_retries; and the topic's dlq_threshold, else default_dlq_threshold. A changed
    setting binds the next nack."""
    def attempts_until_it_leaves(topic: str) -> int:
        enqueue(conn, {"n": 1}, topic=topic)
        for attempt in range(1, 10):
            if nack(conn, dequeue(conn, topic=topic)[0]) != "nacked":
                return attempt
        raise AssertionError(f"{topic}: still nacked after 9 attempts")

    conn.execute("SELECT courier.create_endpoint('by_policy', 'pull', '{}', p_retry_policy => '{\"max_retries\": 2}')")
    assert attempts_until_it_leaves("by_policy") == 3
    conn.execute("SELECT courier.set_setting('default_max_retries', '1')")
    conn.execute("SELECT courier.create_endpoint('by_setting', 'pull', '{}')")
    assert attempts_until_it_leaves("by_setting") == 2
    conn.execute("SELECT courier.set_setting('default_max_retries', '5')")
    conn.execute("SELECT courier.set_setting('default_dlq_threshold', '3')")
    assert attempts_until_it_leaves("by_setting") == 3  # the threshold cuts the five retries short
    assert scalar(conn, "SELECT count(*) FROM courier.dlq WHERE original_topic = 'by_setting'") == 2


def test_alter_topic_sets_limits_and_null_reverts_one_to_the_default(conn, orders):
    config = scalar(conn, """SELECT courier.alter_topic('orders', '{"max_depth": 2, "max_retries": 3}')""")
    assert config == {"max_depth": 2, "max_retries": 3}
    config = scalar(conn, """SELECT courier.alter_topic('orders', '{"max_depth": null, "dlq_threshold": 0}')""")
    assert config == {"max_retries": 3, "dlq_threshold": 0}
    (topic,) = conn.execute("SELECT max_depth, max_retries, dlq_threshold FROM courier.topics()").fetchall()
    assert topic == (0, 3, 0)  # max_depth: the global default again
    with pytest.raises(psycopg.Error, match="max_depth") as refused:
        conn.execute("""SELECT courier.alter_topic('orders', '{"max_depth": -1}')""")
    assert refused.value.sqlstate == "22023"
    with pytest.raises(psycopg.Error, match="colour"):
        conn.execute("""SELECT courier.alter_topic('orders', '{"colour": 1}')""")
    with pytest.raises(psycopg.Error, match="does not exist"):
        conn.execute("""SELECT courier.alter_topic('nowhere', '{}')""")


def test_a_message_ttl_of_its_own_overrides_the_topics(conn):
    conn.execute("""SELECT courier.create_endpoint('orders', 'pull', '{"message_ttl_seconds": 3600}')""")
    own = enqueue(conn, {"n": 1}, ttl_seconds=5)
    topics = enqueue(conn, {"n": 2})
    ttl = "SELECT extract(epoch FROM expires_at - visible_at) FROM courier.queue WHERE id = %s"
    assert (scalar(conn, ttl, (own,)), scalar(conn, ttl, (topics,))) == (5, 3600)
    keyed = enqueue(conn, {"n": 3}, key="k")
    assert enqueue(conn, {"n": 4}, key="k", ttl_seconds=9) == keyed  # an upsert takes the new TTL
    assert scalar(conn, ttl, (keyed,)) == 9
    with pytest.raises(psycopg.Error, match="ttl_seconds") as refused:
        enqueue(conn, {"n": 5}, ttl_seconds=0)
    assert refused.value.sqlstate == "22023"


def test_settle_in_topics_leaves_messages_of_other_topics_alone(conn, orders):
    """`courier serve`'s settle: the token's topics go with the call, and a message of another
    topic is answered 'forbidden' and left as it was, whatever its lease."""
    conn.execute("SELECT courier.create_endpoint('invoices', 'pull', '{}')")
    mine, theirs = enqueue(conn, {"n": 1}), enqueue(conn, {"n": 2}, topic="invoices")
    [held_mine], [held_theirs] = dequeue(conn), dequeue(conn, topic="invoices")

    def settle(verb: str, topics: list[str] | None, **options) -> dict[int, str]:
        rows = conn.execute("SELECT id, result FROM courier.settle_in_topics(%s, %s, %s, %s, %s, %s)",
                            (verb, [mine, theirs], [held_mine["lease"], held_theirs["lease"]], topics,
                             options.get("error"), options.get("timeout"))).fetchall()
        return dict(rows)

    assert settle("extend", ["orders"], timeout=60) == {mine: "extended", theirs: "forbidden"}
    assert settle("nack", ["orders"], error="boom") == {mine: "nacked", theirs: "forbidden"}
    assert (status(conn, mine), status(conn, theirs)) == ("pending", "processing")
    assert settle("ack", []) == {mine: "forbidden", theirs: "forbidden"}
    assert settle("ack", None) == {mine: "not_found", theirs: "acked"}  # every topic; mine was nacked (pending)
    with pytest.raises(psycopg.Error, match="verb"):
        settle("delete", None)
