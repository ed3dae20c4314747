"""`courier archive list` (issue 41, item 8): the archived messages with the ids that
`archive replay-message` takes, filtered by endpoint, status, creation range, ordering key and
correlation id, newest first, stopping at --limit as every listing does (a note on stderr with
the --after ID of the next page, --all, --json --envelope). Every command is a real `courier`
subprocess against the test's own database; the plan test reads EXPLAIN on 200k archived rows."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from sqlkit import archive, queries
from tests.helpers import scalar
from tests.test_cli_pages import courier, note
from tests.test_console_queries import explain_params

DAY = timedelta(days=1)


def month_start(months_back: int) -> datetime:
    now = datetime.now(UTC)
    index = now.year * 12 + now.month - 1 - months_back
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def add(conn: psycopg.Connection, archive_id: int, endpoint_id: int, created_at: datetime, status: str = "completed",
        **columns: object) -> None:
    names = ["id", "endpoint_id", "payload", "status", "completed_at", "created_at", *columns]
    conn.execute(f"INSERT INTO courier.archive ({', '.join(names)}) "
                 f"VALUES ({', '.join(['%s'] * len(names))})",
                 (archive_id, endpoint_id, json.dumps({"secret_payload": archive_id}), status,
                  created_at + timedelta(seconds=1), created_at, *columns.values()))


@pytest.fixture
def history(conn: psycopg.Connection) -> dict[str, object]:
    """Archived messages of two endpoints over two months, through the real delivery path
    (completed, failed) and as the archive holds them (expired, cancelled, purged)."""
    a = scalar(conn, "SELECT courier.create_endpoint('a', 'noop', '{}')")
    b = scalar(conn, "SELECT courier.create_endpoint('b', 'noop', '{}')")
    last_month, this_month = month_start(1) + DAY, month_start(0) + DAY
    correlation = uuid.uuid4()
    for n in range(1, 61):  # a: 60 last month, ids 1..60; every tenth failed with a secret in its error
        status = "failed" if n % 10 == 0 else "completed"
        add(conn, n, a, last_month + n * timedelta(minutes=1), status, retry_count=n % 4,
            last_error="HTTP 500 token=hunter2secret" if status == "failed" else None,
            ordering_key="k-1" if n % 2 else "k-2")
    for n, status in zip(range(101, 106), ["expired", "cancelled", "purged", "completed", "completed"], strict=True):
        add(conn, n, b, this_month + n * timedelta(minutes=1), status, correlation_id=correlation if n > 103 else None)
    conn.execute("SELECT courier.maintain_archive_partitions()")
    return {"a": list(range(60, 0, -1)), "b": list(range(105, 100, -1)), "correlation": correlation,
            "this_month": this_month}


def ids(done) -> list[int]:
    return [row["id"] for row in json.loads(done.stdout)]


def test_lists_newest_first_with_redacted_errors_and_no_payload(dsn, history):
    listed = json.loads(courier(dsn, "archive", "list", "--all", "--json").stdout)
    assert [row["id"] for row in listed] == history["b"] + history["a"]
    assert set(listed[0]) == {"id", "endpoint_name", "status", "retry_count", "last_error", "correlation_id",
                              "ordering_key", "created_at", "completed_at", "archived_at"}
    failed = [row for row in listed if row["status"] == "failed"]
    assert len(failed) == 6 and all("token=" in row["last_error"] for row in failed)
    table = courier(dsn, "archive", "list", "--endpoint", "a", "--status", "failed")
    assert "6 archived messages" in table.stdout and "more follow" not in table.stdout and note(table) == []
    for text in (json.dumps(listed), table.stdout):
        assert "hunter2secret" not in text and "secret_payload" not in text
    tsv = courier(dsn, "archive", "list", "--endpoint", "b", "-o", "tsv").stdout.splitlines()
    assert tsv[0].split("\t")[:3] == ["id", "endpoint_name", "status"] and len(tsv) == 6


@pytest.mark.parametrize("filters, expected", [
    (("--endpoint", "b"), [105, 104, 103, 102, 101]),
    (("--status", "expired"), [101]),
    (("--status", "cancelled"), [102]),
    (("--status", "purged"), [103]),
    (("--endpoint", "a", "--status", "failed"), [60, 50, 40, 30, 20, 10]),
    (("--endpoint", "a", "--ordering-key", "k-2", "--status", "failed"), [60, 50, 40, 30, 20, 10]),
    (("--ordering-key", "k-1", "--limit", "3"), [59, 57, 55]),
])
def test_filters(dsn, history, filters, expected):
    assert ids(courier(dsn, "archive", "list", *filters, "--json")) == expected


def test_created_range_and_correlation_id(dsn, history):
    this_month = history["this_month"]
    start = (this_month + 102 * timedelta(minutes=1)).strftime("%Y-%m-%d %H:%M:%S")
    end = (this_month + 104 * timedelta(minutes=1)).strftime("%Y-%m-%d %H:%M:%S")
    assert ids(courier(dsn, "archive", "list", "--from", start, "--to", end, "--json")) == [103, 102]
    assert ids(courier(dsn, "archive", "list", "--to", this_month.strftime("%Y-%m-%d"), "--json"))[:3] == [60, 59, 58]
    assert ids(courier(dsn, "archive", "list", "--correlation-id", str(history["correlation"]), "--json")) == [105, 104]
    wrong = courier(dsn, "archive", "list", "--from", end, "--to", start, code=2)
    assert "--to" in wrong.stderr and "later than --from" in wrong.stderr


def test_stops_at_limit_and_says_how_to_go_on(dsn, conn, history):
    a = history["a"]
    first = courier(dsn, "archive", "list", "--endpoint", "a")
    assert "first 50 archived messages (more follow)" in first.stdout
    assert note(first) == [f"note: stopped after 50 archived messages; more follow. Next page: --after {a[49]}; "
                           f"all the rest: --all --after {a[49]}; or a larger --limit."]
    wrapped = json.loads(courier(dsn, "archive", "list", "--endpoint", "a", "--json", "--envelope").stdout)
    assert [row["id"] for row in wrapped["items"]] == a[:50]
    assert (wrapped["count"], wrapped["more"], wrapped["next_after"]) == (50, True, a[49])
    # Newer messages archived meanwhile do not shift the next page.
    add(conn, 1000, scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'a'"), datetime.now(UTC))
    rest = courier(dsn, "archive", "list", "--endpoint", "a", "--after", str(a[49]), "--json", "--envelope")
    assert json.loads(rest.stdout) == {**json.loads(rest.stdout), "count": 10, "more": False, "next_after": None}
    assert [row["id"] for row in json.loads(rest.stdout)["items"]] == a[50:] and note(rest) == []
    everything = courier(dsn, "archive", "list", "--endpoint", "a", "--all", "--json")
    assert ids(everything) == [1000, *a] and note(everything) == []


def test_wrong_input_is_one_line(dsn, history):
    unknown = courier(dsn, "archive", "list", "--endpoint", "nope", code=1)
    assert 'endpoint "nope" does not exist' in unknown.stderr
    assert "--envelope" in courier(dsn, "archive", "list", "--envelope", code=2).stderr
    assert "--all" in courier(dsn, "archive", "list", "--all", "--limit", "5", code=2).stderr
    assert "'--status'" in courier(dsn, "archive", "list", "--status", "pending", code=2).stderr
    huge = courier(dsn, "archive", "list", "--after", "99999999999999999999", code=2)
    assert "'--after'" in huge.stderr and "0<=x<=9223372036854775807" in huge.stderr


@pytest.fixture
def big_archive(conn: psycopg.Connection) -> psycopg.Connection:
    """200k archived messages over three monthly partitions: endpoint 'busy' 4 in 5 of them,
    'some' the rest but for 100 of 'rare', the oldest; analyzed."""
    for name in ("busy", "some", "rare"):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    conn.execute("""
        INSERT INTO courier.archive (id, endpoint_id, payload, status, completed_at, created_at)
        SELECT g, CASE WHEN g <= 100 THEN 3 WHEN g %% 5 = 0 THEN 2 ELSE 1 END, '{}',
               CASE WHEN g %% 50 = 0 THEN 'failed' WHEN g %% 97 = 0 THEN 'expired' ELSE 'completed' END,
               %(start)s::timestamptz + g * interval '30 seconds' + interval '1 second',
               %(start)s::timestamptz + g * interval '30 seconds'
        FROM generate_series(1, 200000) g""", {"start": month_start(2)})
    conn.execute("SELECT courier.maintain_archive_partitions()")
    conn.execute("VACUUM ANALYZE courier.archive")
    return conn


def plan(conn: psycopg.Connection, chosen: archive.ArchiveFilter, after: int | None = None) -> list[dict]:
    return explain_params(conn, queries.query("list_archive_page"), {**vars(chosen), "limit": 51, "after": after})


def test_an_endpoints_page_walks_the_primary_keys_backwards_and_stops(big_archive):
    """ORDER BY id DESC LIMIT n with --endpoint merges each partition's primary key backwards
    and stops after n matches: no partition is read whole (a rare endpoint is the exception,
    since no index leads with endpoint_id; see the query's comment)."""
    conn = big_archive
    for chosen, after in [(archive.ArchiveFilter(endpoint_id=1), None), (archive.ArchiveFilter(endpoint_id=1), 150_000),
                          (archive.ArchiveFilter(endpoint_id=2), None), (archive.ArchiveFilter(status="failed"), None),
                          (archive.ArchiveFilter(), 100_000)]:
        nodes = plan(conn, chosen, after)
        scans = [n for n in nodes if n.get("Relation Name", "").startswith("archive")]
        assert scans and not [n for n in scans if n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan")], (chosen, after)
        assert {n["Index Name"].split("_", 3)[-1] for n in scans} == {"pkey"}, (chosen, after)
        assert any(n["Node Type"] == "Merge Append" for n in nodes), (chosen, after)
        got, more = archive.list_messages_page(conn, chosen, 50, after)
        expected = [row[0] for row in conn.execute(
            "SELECT id FROM courier.archive WHERE (%(e)s::int IS NULL OR endpoint_id = %(e)s) "
            "AND (%(s)s::text IS NULL OR status = %(s)s) AND id < coalesce(%(a)s, 9223372036854775807) "
            "ORDER BY id DESC LIMIT 51", {"e": chosen.endpoint_id, "s": chosen.status, "a": after})]
        assert [row.id for row in got] == expected[:50] and more == (len(expected) == 51)
    # Expired messages of one endpoint come from archive_expired_idx; a range reads its partitions only.
    used = {n.get("Index Name", "") for n in plan(conn, archive.ArchiveFilter(endpoint_id=2, status="expired"))}
    assert any(name.endswith("endpoint_id_id_idx") for name in used), used
    start = month_start(1) + 3 * DAY
    ranged = plan(conn, archive.ArchiveFilter(from_ts=start, to_ts=start + DAY))
    assert len({n["Relation Name"] for n in ranged if n.get("Relation Name", "").startswith("archive")}) == 1
