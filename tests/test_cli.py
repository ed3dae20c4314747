"""The `courier` console script as a user runs it: a real subprocess against a real database.

Every command gets an explicit --dsn and an environment without COURIER_DSN, DATABASE_URL or
PG* variables, so nothing but the command line decides where it connects. The assertions are
about what a user sees: exit codes, one-line errors with their SQLSTATE, JSON output, and
the rows that end up in the database.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqlkit import migrate
from tests.helpers import claim, queue_rows, scalar

COURIER = Path(sys.executable).parent / "courier"
ENV = {key: value for key, value in os.environ.items()
       if not key.startswith("PG") and key not in ("COURIER_DSN", "DATABASE_URL")}
ENV["COLUMNS"] = "80"  # a standard terminal, whatever runs the tests

HOOK = '{"url": "http://127.0.0.1:9000/hook", "allow_internal": true}'
SECRETS = ["s3cret", "whsec_YWJjMTIz", "zzz-top"]
SECRET_CONFIG = json.dumps({
    "url": "https://hooks.example.com/billing",
    "auth": {"type": "bearer", "token": "s3cret"},
    "signing": {"secret": "whsec_YWJjMTIz"},
    "headers": {"X-Api-Key": "zzz-top", "X-Team": "billing"},
})


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def text(self) -> str:
        """stdout with rich's line wrapping undone."""
        return " ".join(self.out.split())


def run(*args: str, dsn: str | None = None, stdin: str = "") -> Result:
    command = [str(COURIER), *args, *(["--dsn", dsn] if dsn is not None else [])]
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, env=ENV, timeout=60)
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def courier(dsn: str):
    """Run `courier ARGS --dsn <the test's database>`."""
    def invoke(*args: str, stdin: str = "") -> Result:
        return run(*args, dsn=dsn, stdin=stdin)
    return invoke


@pytest.fixture
def billing(conn) -> str:
    """Endpoint 'billing', made through SQL to keep the tests fast (the CLI path is tested below)."""
    conn.execute("SELECT courier.create_endpoint('billing', 'http', %s)", (HOOK,))
    return "billing"


def assert_ok(result: Result) -> Result:
    assert result.code == 0, result
    assert "Traceback" not in result.out + result.err
    return result


def assert_one_line_error(result: Result, *fragments: str, code: int = 1) -> str:
    """The user sees exactly one line on stderr, naming the problem, and no traceback."""
    assert result.code == code, result
    assert "Traceback" not in result.out + result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def assert_json_error(result: Result, sqlstate: str | None, kind: str) -> dict[str, Any]:
    assert result.code == 1, result
    assert result.err == "" and "Traceback" not in result.out
    error = result.json()
    assert error["sqlstate"] == sqlstate and error["kind"] == kind and error["error"]
    return error


def assert_usage_error(result: Result, fragment: str) -> None:
    assert result.code == 2, result
    assert result.out == ""
    assert "Traceback" not in result.err
    assert "Error: " in result.err and fragment in result.err, result.err


# Endpoints -------------------------------------------------------------------------------


def test_endpoint_create_list_and_show(courier):
    created = assert_ok(courier("endpoint", "create", "billing", "http", HOOK))
    assert created.out.strip() == "created endpoint billing (id 1, http)"

    [listed] = assert_ok(courier("endpoint", "list", "--json")).json()
    assert listed["name"] == "billing" and listed["protocol"] == "http" and listed["enabled"] is True
    assert listed["config"] == {"url": "http://127.0.0.1:9000/hook", "allow_internal": True}
    assert (listed["circuit_state"], listed["pending_messages"]) == ("closed", 0)

    shown = assert_ok(courier("endpoint", "show", "billing", "--json")).json()
    assert shown == listed
    table = assert_ok(courier("endpoint", "show", "billing")).out
    assert "billing" in table and "http://127.0.0.1:9000/hook" in table and "global defaults" in table


def test_endpoint_secrets_are_shown_as_stars_and_never_in_clear(courier):
    assert_ok(courier("endpoint", "create", "secured", "http", SECRET_CONFIG))
    shown = courier("endpoint", "show", "secured", "--json")
    table = courier("endpoint", "show", "secured")
    outputs = [courier("endpoint", "list", "--json"), shown, table,
               courier("endpoint", "alter", "secured", "--config", SECRET_CONFIG, "--json")]
    for result in outputs:
        assert_ok(result)
        for secret in SECRETS:
            assert secret not in result.out + result.err

    config = shown.json()["config"]
    assert config["auth"] == {"type": "bearer", "token": "***"}
    assert config["signing"] == {"secret": "***"}
    assert config["headers"] == {"X-Api-Key": "***", "X-Team": "billing"}
    assert config["url"] == "https://hooks.example.com/billing"
    assert '"token": "***"' in table.out


def test_endpoint_url_credentials_are_not_shown(courier):
    config = '{"url": "amqp://app:s3cret@rabbit.internal:5672/orders", "routing_key": "orders"}'
    assert_ok(courier("endpoint", "create", "orders", "amqp", config))
    shown = assert_ok(courier("endpoint", "show", "orders", "--json"))
    assert "s3cret" not in shown.out


def test_endpoint_alter_changes_config_policy_and_description(courier, billing):
    altered = assert_ok(courier("endpoint", "alter", "billing",
                                "--config", '{"url": "https://example.com/v2", "method": "PUT"}',
                                "--retry-policy", '{"max_retries": 3, "backoff": "linear"}',
                                "--description", "Invoices", "--json")).json()
    assert altered["config"] == {"url": "https://example.com/v2", "method": "PUT"}
    assert altered["retry_policy"] == {"max_retries": 3, "backoff": "linear"}
    assert altered["description"] == "Invoices"
    assert assert_ok(courier("endpoint", "alter", "billing", "--description", "Bills")).out.strip() \
        == "altered endpoint billing"
    # Only the description changed; the rest stands.
    shown = courier("endpoint", "show", "billing", "--json").json()
    assert (shown["description"], shown["config"]["method"]) == ("Bills", "PUT")

    assert_usage_error(courier("endpoint", "alter", "billing"), "nothing to change")
    assert_one_line_error(courier("endpoint", "alter", "billing", "--config", '{"url": 5}'),
                          'needs "url"', "SQLSTATE 22023")


def test_endpoint_disable_refuses_sends_until_enabled(courier, billing):
    assert assert_ok(courier("endpoint", "disable", "billing")).out.strip() == "billing disabled"
    again = assert_ok(courier("endpoint", "disable", "billing", "--json")).json()
    assert again == {"name": "billing", "enabled": False, "changed": False}

    assert_one_line_error(courier("send", "billing", "{}"), 'endpoint "billing" is disabled', "SQLSTATE 55000",
                          "courier endpoint enable")

    assert assert_ok(courier("endpoint", "enable", "billing")).out.strip() == "billing enabled"
    assert_ok(courier("send", "billing", "{}"))


def test_endpoint_drop_refused_while_messages_are_pending(courier, conn, billing):
    conn.execute("SELECT courier.send('billing', '{\"n\": 1}')")

    assert_one_line_error(courier("endpoint", "drop", "billing"),
                          'endpoint "billing" still has 1 active message(s)', "SQLSTATE 55006")
    # --force asks first; with nobody to say yes, nothing happens.
    declined = courier("endpoint", "drop", "billing", "--force")
    assert declined.code == 1 and "Aborted!" in declined.err and "Traceback" not in declined.err
    assert queue_rows(conn) == 1

    dropped = assert_ok(courier("endpoint", "drop", "billing", "--force", "--yes", "--json")).json()
    assert dropped == {"name": "billing", "dropped": True}
    assert queue_rows(conn) == 0
    assert courier("endpoint", "list", "--json").json() == []


def test_endpoint_drop_without_messages_needs_no_force(courier, billing):
    assert assert_ok(courier("endpoint", "drop", "billing")).out.strip() == "dropped endpoint billing"


# Sending ---------------------------------------------------------------------------------


def test_send_with_options_and_idempotent_retry(courier, conn, billing):
    args = ["send", "billing", '{"order": 1}', "--priority", "8", "--ordering-key", "c-1",
            "--idempotency-key", "o-1", "--json"]
    first = assert_ok(courier(*args)).json()
    assert first["endpoint"] == "billing" and isinstance(first["id"], int)
    assert assert_ok(courier(*args)).json() == first
    assert queue_rows(conn) == 1

    row = conn.execute("SELECT payload, priority, ordering_key, idempotency_key, status FROM courier.queue "
                       "WHERE id = %s", (first["id"],)).fetchone()
    assert row == ({"order": 1}, 8, "c-1", "o-1", "pending")
    plain = assert_ok(courier("send", "billing", '{"order": 2}')).out.strip()
    assert re.fullmatch(r"sent message \d+ to billing", plain)


def test_send_payload_from_file_and_from_stdin(courier, conn, billing, tmp_path):
    payload_file = tmp_path / "order.json"
    payload_file.write_text('{"from": "file"}\n')
    from_file = assert_ok(courier("send", "billing", "--file", str(payload_file), "--json")).json()["id"]
    from_stdin = assert_ok(courier("send", "billing", "--json", stdin='{"from": "stdin"}')).json()["id"]
    from_dash = assert_ok(courier("send", "billing", "-f", "-", "--json", stdin='{"from": "dash"}')).json()["id"]

    rows = conn.execute("SELECT id, payload FROM courier.queue ORDER BY id").fetchall()
    assert rows == [(from_file, {"from": "file"}), (from_stdin, {"from": "stdin"}), (from_dash, {"from": "dash"})]
    assert_usage_error(courier("send", "billing", "{}", "--file", str(payload_file)), "not both")


def test_send_batch_of_json_lines_from_stdin(courier, conn, billing):
    lines = '{"n": 1}\n{"n": 2}\n\n{"n": 3}\n'
    sent = assert_ok(courier("send", "billing", "--batch", "--priority", "3", "--json", stdin=lines)).json()
    assert sent["count"] == 3 and sent["ids"] == sorted(sent["ids"])
    rows = conn.execute("SELECT payload, priority FROM courier.queue WHERE id = ANY(%s) ORDER BY id",
                        (sent["ids"],)).fetchall()
    assert rows == [({"n": 1}, 3), ({"n": 2}, 3), ({"n": 3}, 3)]

    as_array = assert_ok(courier("send", "billing", '[{"n": 4}, {"n": 5}]', "--batch"))
    assert as_array.out.startswith("sent 2 message(s) to billing: ids ")

    assert_usage_error(courier("send", "billing", "--batch", stdin='{"n": 6}\n{"n": \n'), "stdin line 2")
    assert_usage_error(courier("send", "billing", "--batch", "--idempotency-key", "k", stdin='{"n": 7}'),
                       "--batch takes only --priority")
    assert queue_rows(conn) == 5


def test_send_headers_and_metadata(courier, conn, billing):
    sent = assert_ok(courier("send", "billing", "{}", "-H", "X-Tenant=acme", "--header", "X-Query=a=b",
                             "--metadata", '{"source": "cli"}', "--json")).json()
    row = conn.execute("SELECT headers, metadata FROM courier.queue WHERE id = %s", (sent["id"],)).fetchone()
    assert row == ({"X-Tenant": "acme", "X-Query": "a=b"}, {"source": "cli"})

    assert_usage_error(courier("send", "billing", "{}", "--header", "no-equals-sign"), "is not KEY=VALUE")
    assert_usage_error(courier("send", "billing", "{}", "--metadata", "[1]"), "must be a JSON object")


def test_send_delay_and_ttl(courier, conn, billing):
    sent = assert_ok(courier("send", "billing", '{"later": true}', "--delay", "3600", "--ttl", "7200", "--json"))
    row = conn.execute("SELECT scheduled_at - created_at, expires_at - created_at FROM courier.queue "
                       "WHERE id = %s", (sent.json()["id"],)).fetchone()
    assert abs(row[0] - timedelta(hours=1)) < timedelta(seconds=30)
    assert abs(row[1] - timedelta(hours=2)) < timedelta(seconds=30)
    assert claim(conn) == []  # not due for an hour

    assert_one_line_error(courier("send", "billing", "{}", "--delay", "3600", "--ttl", "60"),
                          "is not after scheduled_at", "SQLSTATE 22023")
    assert_usage_error(courier("send", "billing", "{}", "--delay", "5", "--scheduled-at", "2999-01-01T00:00:00"),
                       "alternatives")
    assert_usage_error(courier("send", "billing", "{}", "--ttl", "0"), "--ttl")


# Settings --------------------------------------------------------------------------------


def test_config_get_all_and_one(courier):
    settings = {s["name"]: s for s in assert_ok(courier("config", "get", "--json")).json()}
    assert settings["max_queue_size"]["value"] == "1000000"
    assert (settings["max_queue_size"]["min_value"], settings["max_queue_size"]["max_value"]) == (0, 2147483647)
    assert "1 .. 120" in assert_ok(courier("config", "get")).out  # the table shows the allowed range

    assert assert_ok(courier("config", "get", "max_queue_size")).out == "1000000\n"
    assert_one_line_error(courier("config", "get", "nope"), 'unknown setting "nope"', "SQLSTATE 42704")


def test_config_get_table_shows_full_setting_names(courier):
    table = assert_ok(courier("config", "get")).out
    assert "archive_retention_months" in table and "max_payload_size" in table


def test_config_set_accepts_in_range_and_rejects_negative(courier, conn):
    assert assert_ok(courier("config", "set", "max_queue_size", "5000")).out.strip() == "max_queue_size = 5000"
    assert scalar(conn, "SELECT courier.get_setting('max_queue_size')") == "5000"

    line = assert_one_line_error(courier("config", "set", "max_queue_size", "-5"),
                                 "max_queue_size = -5 is out of range", "SQLSTATE 22023")
    assert "0 to 2147483647" in line
    error = assert_json_error(courier("config", "set", "max_queue_size", "-5", "--json"), "22023", "InvalidInput")
    assert "0 to 2147483647" in error["hint"]
    assert scalar(conn, "SELECT courier.get_setting('max_queue_size')") == "5000"


def test_config_set_refuses_a_reaper_schedule_for_a_day_that_never_comes(courier, conn):
    """30 February: stored, the delete reaper would never run again."""
    assert_one_line_error(courier("config", "set", "delete_reaper_schedule", "0 0 30 2 *"),
                          "delete_reaper_schedule names a day that never comes", "SQLSTATE 22023")
    assert scalar(conn, "SELECT courier.get_setting('delete_reaper_schedule')") == ""


# Exit codes and error output -----------------------------------------------------------


@pytest.mark.parametrize(("args", "fragment"), [
    (["send", "billing", "{}", "--priority", "11"], "11 is not in the range 0<=x<=10"),
    (["send", "billing", '{"order": 1'], "not valid JSON"),
    (["endpoint", "create", "ftp-hook", "ftp", "{}"], "'ftp' is not one of"),
    (["endpoint", "create", "events", "kafka", "{}"], "Kafka is not offered: no dispatcher delivers to it"),
    (["endpoint", "create", "bad-config", "http", "not json"], "not valid JSON"),
], ids=["priority-11", "malformed-payload", "unknown-protocol", "kafka", "malformed-config"])
def test_usage_errors_exit_2_and_change_nothing(courier, conn, billing, args, fragment):
    assert_usage_error(courier(*args), fragment)
    assert queue_rows(conn) == 0
    assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 1


def _send_once(courier, conn) -> None:
    conn.execute("""SELECT courier.send_with_options('billing', '{"order": 1}', p_idempotency_key := 'o-1')""")


def _disable(courier, conn) -> None:
    conn.execute("SELECT courier.disable_endpoint('billing')")


def _limit_queue_to_one(courier, conn) -> None:
    assert_ok(courier("config", "set", "max_queue_size", "1"))
    assert_ok(courier("send", "billing", "{}"))


@pytest.mark.parametrize(("setup", "args", "sqlstate", "kind", "fragment"), [
    (None, ["send", "nobody", "{}"], "P0002", "NotFound", 'endpoint "nobody" does not exist'),
    (_disable, ["send", "billing", "{}"], "55000", "WrongState", 'endpoint "billing" is disabled'),
    (_send_once, ["send", "billing", '{"order": 2}', "--idempotency-key", "o-1"], "23505", "Conflict",
     "Idempotency key 'o-1' conflict"),
    (_limit_queue_to_one, ["send", "billing", "{}"], "53400", "Backpressure", "Queue backpressure"),
    (None, ["endpoint", "create", "billing", "http", HOOK], "42710", "Conflict",
     'endpoint "billing" already exists'),
], ids=["unknown-endpoint", "disabled-endpoint", "idempotency-conflict", "backpressure", "duplicate-endpoint"])
def test_operation_errors_exit_1_with_one_line_or_json(courier, conn, billing, setup, args, sqlstate, kind,
                                                       fragment):
    if setup:
        setup(courier, conn)
    line = assert_one_line_error(courier(*args), fragment, f"(SQLSTATE {sqlstate})")
    assert line.startswith("error: ")
    error = assert_json_error(courier(*args, "--json"), sqlstate, kind)
    assert fragment in error["error"]


@pytest.mark.parametrize("bad_dsn", ["postgresql://postgres@127.0.0.1:1/x", "host==", "not a dsn"],
                         ids=["unreachable", "malformed", "garbage"])
def test_database_that_cannot_be_reached(bad_dsn):
    line = assert_one_line_error(run("send", "billing", "{}", dsn=bad_dsn))
    assert line.startswith("error: ")
    error = run("migrate", "--json", dsn=bad_dsn)
    assert error.code == 1 and "Traceback" not in error.out + error.err
    assert error.json()["sqlstate"] is None and error.json()["error"]


def test_unreachable_database_says_cannot_connect_and_where_to_look():
    line = assert_one_line_error(run("endpoint", "list", dsn="postgresql://postgres@127.0.0.1:1/x"),
                                 "cannot connect to PostgreSQL")
    assert "--dsn" in line


def test_unreachable_database_error_names_server_and_reason():
    line = assert_one_line_error(run("endpoint", "list", dsn="postgresql://postgres@127.0.0.1:1/x"))
    assert "Connection refused" in line and "127.0.0.1" in line and "\t" not in line


# Schema ----------------------------------------------------------------------------------


def test_migrate_fresh_database_then_up_to_date(empty_dsn):
    labels = [m.label for m in migrate.available()]
    latest = migrate.available()[-1].version

    first = assert_ok(run("migrate", dsn=empty_dsn))
    assert first.text.startswith(f"applied {len(labels)} migration(s): ")
    assert all(label in first.text for label in labels)
    assert first.text.endswith(f"schema version {latest}")

    assert assert_ok(run("migrate", dsn=empty_dsn)).text == f"schema is up to date (version {latest})"
    status = assert_ok(run("migrate", "--status", "--json", dsn=empty_dsn)).json()
    assert status == {"installed_version": latest, "latest_version": latest, "pending": []}
    # The migrated database is immediately usable.
    assert_ok(run("endpoint", "create", "billing", "http", HOOK, dsn=empty_dsn))
    assert_ok(run("send", "billing", "{}", dsn=empty_dsn))


def test_commands_without_schema_hint_courier_migrate(empty_dsn):
    for args in (["endpoint", "list"], ["send", "billing", "{}"], ["config", "get"]):
        assert_one_line_error(run(*args, dsn=empty_dsn), "SQLSTATE", "Hint: Install or upgrade the schema with "
                                                                     "`courier migrate`")
    pending = assert_ok(run("migrate", "--status", "--json", dsn=empty_dsn)).json()
    assert pending["installed_version"] == 0 and len(pending["pending"]) == len(migrate.available())
    # Nothing is older than the baseline to stop at.
    assert_usage_error(run("migrate", "--target", "3", dsn=empty_dsn), "--target")


def test_migrate_records_a_database_built_before_the_squash_as_the_baseline(empty_dsn):
    from tests.test_migrations import migrate_before_the_squash

    migrate_before_the_squash(empty_dsn)
    status = assert_ok(run("migrate", "--status", "--json", dsn=empty_dsn)).json()
    assert status["pending"] == ["0001-0032 recorded as the baseline", *(m.label for m in migrate.available()[1:])]
    done = assert_ok(run("migrate", dsn=empty_dsn)).text
    assert done.startswith("recorded migrations 0001-0032 as the baseline 0032_baseline")
    assert assert_ok(run("migrate", "--status", "--json", dsn=empty_dsn)).json()["pending"] == []


def test_command_on_outdated_schema_hints_courier_migrate(empty_dsn):
    """As on a database an older Courier migrated: a function this one calls is not there yet."""
    assert_ok(run("migrate", dsn=empty_dsn))
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DROP FUNCTION courier.send_with_options")
        conn.execute("UPDATE courier.schema_functions SET checksum = 'older' WHERE area = 'sending'")
    assert_ok(run("endpoint", "create", "billing", "http", HOOK, dsn=empty_dsn))
    line = assert_one_line_error(run("send", "billing", "{}", dsn=empty_dsn), "SQLSTATE 42883")
    assert "courier migrate" in line


def test_payload_over_the_size_limit_is_a_one_line_error(courier, conn, billing):
    conn.execute("SELECT courier.set_setting('max_payload_size', '1024')")
    big = json.dumps({"blob": "x" * 5000})
    assert_one_line_error(courier("send", "billing", big), "exceeds max_payload_size", "SQLSTATE 54000")
    assert_one_line_error(courier("send", "billing", "--batch", stdin=big + "\n"),
                          "batch element 1 exceeds max_payload_size", "SQLSTATE 54000")
    # JSON Lines: the refused element is named by its input line too (blank lines do not count).
    assert_one_line_error(courier("send", "billing", "--batch", stdin='{"n": 1}\n\n' + big + "\n"),
                          "stdin line 3: batch element 2 exceeds max_payload_size", "SQLSTATE 54000")
    assert queue_rows(conn) == 0


def test_dsn_option_also_works_before_the_subcommand(billing, dsn, conn):
    assert_ok(run("--dsn", dsn, "send", "billing", "{}"))
    assert queue_rows(conn) == 1
