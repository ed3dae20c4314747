"""`courier message cancel|delete` and `courier purge` as a user runs them: a real subprocess
against the test's database (tests.test_cli.run)."""

from __future__ import annotations

import pytest

from tests.helpers import claim, message_status, scalar
from tests.test_cli import run


def setup(conn) -> list[int]:
    conn.execute("SELECT courier.create_endpoint('billing', 'noop')")
    return [scalar(conn, "SELECT courier.send_with_options('billing', %s::jsonb, p_idempotency_key := %s)",
                   (f'{{"n": {n}}}', f"k-{n}")) for n in range(4)]


def test_message_cancel_by_id_and_by_key(dsn, conn):
    first, second, *_ = setup(conn)
    done = run("message", "cancel", str(first), dsn=dsn)
    assert done.code == 0 and f"cancelled message {first} of billing (pending)" in done.text
    assert run("message", "cancel", str(first), dsn=dsn).text == f"message {first} of billing was already cancelled"
    by_key = run("message", "cancel", "--key", "k-1", "--endpoint", "billing", "--json", dsn=dsn)
    assert by_key.code == 0 and by_key.json() == [{"id": second, "endpoint_name": "billing", "was": "pending"}]
    assert message_status(conn, first) == message_status(conn, second) == "cancelled"
    by = scalar(conn, "SELECT details ->> 'by' FROM courier.event_log WHERE event_type = 'message.cancelled' "
                      "ORDER BY id LIMIT 1")
    assert by.startswith("cli:")


def test_message_cancel_errors_are_one_line_naming_what_is_wrong(dsn, conn):
    setup(conn)
    unknown = run("message", "cancel", "999999", dsn=dsn)
    assert unknown.code == 1
    assert unknown.err.startswith("error: id: message 999999 does not exist (SQLSTATE P0002)")
    no_key = run("message", "cancel", "--key", "nope", "--endpoint", "billing", dsn=dsn)
    assert no_key.code == 1 and 'key: no pending or processing message of "billing" has key "nope"' in no_key.err
    assert run("message", "cancel", dsn=dsn).code == 2  # neither an id nor a key: usage
    assert "--key needs --endpoint" in run("message", "cancel", "--key", "k-0", dsn=dsn).err
    as_json = run("message", "cancel", "999999", "--json", dsn=dsn)
    assert as_json.json()["kind"] == "NotFound" and as_json.json()["sqlstate"] == "P0002"


def test_message_delete(dsn, conn):
    first, second, *_ = setup(conn)
    done = run("message", "delete", str(first), "--json", dsn=dsn)
    assert done.code == 0 and done.json() == {"id": first, "deleted": True, "was": "pending"}
    assert message_status(conn, first) is None
    claim(conn)  # the rest in processing
    refused = run("message", "delete", str(second), dsn=dsn)
    assert refused.code == 1 and "is in processing" in refused.err and "courier message cancel" in refused.err
    assert message_status(conn, second) == "processing"


def test_purge_asks_naming_the_count_and_needs_yes_without_a_terminal(dsn, conn):
    setup(conn)
    claim(conn, batch=1)
    refused = run("purge", "billing", dsn=dsn)
    assert refused.code == 1
    assert "courier purge removes 3 pending messages of billing and asks first" in refused.err
    assert "add --yes" in refused.err
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 3
    done = run("purge", "billing", "--yes", "--json", dsn=dsn)
    assert done.json() == {"purged": 3, "endpoint": "billing", "dlq": False, "archived": True}
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 1  # the one in processing
    assert run("purge", "billing", dsn=dsn).text == "purged 0 messages of billing"  # nothing to ask about
    assert run("purge", "nowhere", "--yes", dsn=dsn).err.startswith(
        'error: endpoint: endpoint "nowhere" does not exist (SQLSTATE P0002)')


def test_purge_no_archive_and_dlq(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{\"max_retries\": 0}')")
    conn.execute("SELECT courier.enqueue('orders', '{}') FROM generate_series(1, 3)")
    (dead, lease) = conn.execute("SELECT id, lease FROM courier.dequeue('orders', 1, 30)").fetchone()
    conn.execute("SELECT courier.nack(%s::bigint, %s, 'bad')", (dead, lease))
    done = run("purge", "orders", "--no-archive", "--yes", dsn=dsn)
    assert done.code == 0 and done.text == "purged 2 messages of orders"
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'purged'") == 0
    dlq = run("purge", "orders.dlq", "--yes", "--json", dsn=dsn)
    assert dlq.json() == {"purged": 1, "endpoint": "orders.dlq", "dlq": True, "archived": False}
    assert scalar(conn, "SELECT count(*) FROM courier.dlq WHERE status = 'failed'") == 0


BIGINT_MAX = "9223372036854775807"
HUGE = "99999999999999999999"  # past bigint


@pytest.mark.parametrize(("args", "named", "bounds"), [
    (("message", "cancel", HUGE), "'[MESSAGE_ID]'", f"1<=x<={BIGINT_MAX}"),
    (("message", "cancel", "0"), "'[MESSAGE_ID]'", f"1<=x<={BIGINT_MAX}"),
    (("message", "delete", HUGE), "'MESSAGE_ID'", f"1<=x<={BIGINT_MAX}"),
    (("dlq", "show", HUGE), "'DLQ_ID'", f"1<=x<={BIGINT_MAX}"),
    (("dlq", "redrive", "5", HUGE), "'[DLQ_IDS]...'", f"1<=x<={BIGINT_MAX}"),
    (("archive", "replay-message", HUGE), "'ARCHIVE_ID'", f"1<=x<={BIGINT_MAX}"),
    (("topic", "requeue", "orders.dlq", HUGE), "'DLQ_ID'", f"1<=x<={BIGINT_MAX}"),
    (("ack", HUGE, "1"), "'MESSAGE_ID'", f"1<=x<={BIGINT_MAX}"),
    (("nack", "71", "99999999999"), "'LEASE'", "-2147483648<=x<=2147483647"),
    (("snooze", "71", "-99999999999", "5"), "'LEASE'", "-2147483648<=x<=2147483647"),
    (("dlq", "list", "--after", "999999999999999999999"), "'--after'", f"0<=x<={BIGINT_MAX}"),
    (("events", "--after", HUGE), "'--after'", f"0<=x<={BIGINT_MAX}"),
    (("archive", "list", "--after", HUGE), "'--after'", f"0<=x<={BIGINT_MAX}"),
])
def test_numbers_out_of_range_are_a_usage_error_naming_the_argument(dsn, args, named, bounds):
    """Not PostgreSQL's "function ...(numeric) does not exist" or "bigint out of range": click
    says which argument and its bounds, in one line, exit 2."""
    done = run(*args, dsn=dsn)
    errors = [line for line in done.err.splitlines() if line.startswith("Error:")]
    assert done.code == 2 and len(errors) == 1, done.err
    assert named in errors[0] and bounds in errors[0], errors
    assert "SQLSTATE" not in done.err and "Traceback" not in done.err


@pytest.mark.parametrize("args", [("message", "cancel", "abc"), ("message", "delete", "1.5"), ("dlq", "show", "x"),
                                  ("nack", "71", "abc"), ("archive", "replay-message", "")])
def test_a_word_for_a_number_is_still_a_clean_usage_error(dsn, args):
    done = run(*args, dsn=dsn)
    assert done.code == 2 and "is not a valid integer" in done.err and "Traceback" not in done.err


def test_the_largest_ids_and_leases_reach_the_database(dsn, conn):
    """At the bounds the database answers, as for any unknown id: not a type error."""
    conn.execute("SELECT courier.create_endpoint('orders', 'pull')")
    cancel = run("message", "cancel", BIGINT_MAX, dsn=dsn)
    assert cancel.code == 1 and cancel.err.startswith(f"error: id: message {BIGINT_MAX} does not exist")
    for lease in ("2147483647", "-2147483648"):
        nack = run("nack", BIGINT_MAX, lease, dsn=dsn)
        assert nack.code == 1 and "not found" in nack.out + nack.err and "SQLSTATE 22003" not in nack.err
    assert run("dlq", "list", "--after", BIGINT_MAX, dsn=dsn).code == 0


def test_purge_of_a_dlq_refuses_no_archive_naming_both_flags(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('orders', 'pull')")
    for args, named in ((("orders", "--dlq"), "--dlq"), (("orders.dlq",), "--dlq (which naming orders.dlq implies)")):
        done = run("purge", *args, "--no-archive", "--yes", dsn=dsn)
        errors = [line for line in done.err.splitlines() if line.startswith("Error:")]
        assert done.code == 2 and len(errors) == 1, done.err
        assert "--no-archive" in errors[0] and named in errors[0], errors
    assert run("purge", "orders", "--dlq", "--yes", dsn=dsn).code == 0  # without --no-archive, as before
