"""Periodic schedules over `courier serve` (issue 42, item 1): admin tokens create, read, pause,
resume and drop them; a monitor token lists those in its scope, without their messages; what the
SQL API refuses is a 4xx naming the field. A real server process and the test's own database."""
# ruff: noqa: F811  (the `server` and `orders` fixtures come from test_serve, by import)

from __future__ import annotations

from datetime import datetime

from sqlkit import tokens
from tests.helpers import scalar
from tests.test_serve import call, orders, server, token  # noqa: F401


def test_an_admin_creates_reads_pauses_resumes_and_drops_a_schedule(server, conn, orders):
    admin = token(conn, "ops", ["admin"])
    status, body, _ = call(server, "POST", "/api/schedules", admin, {
        "name": "nightly", "cron": "0 3 * * *", "endpoint": "orders", "time_zone": "Europe/Berlin",
        "payload": {"report": "daily", "exact": 0.1000000000000000055511151231257827, "big": 2**70},
        "headers": {"X-Job": "report"}, "metadata": {"team": "ops"}, "priority": 3, "catch_up": "all",
        "catch_up_limit": 5, "description": "the nightly report"})
    assert status == 201, body
    assert (body["name"], body["cron"], body["time_zone"], body["endpoint_name"], body["state"]) == \
        ("nightly", "0 3 * * *", "Europe/Berlin", "orders", "running")
    assert (body["catch_up"], body["catch_up_limit"], body["late"], body["paused_at"]) == ("all", 5, False, None)
    assert datetime.fromisoformat(body["next_run_at"]).astimezone().hour is not None
    assert "payload" not in body

    status, body, _ = call(server, "GET", "/api/schedules/nightly", admin)
    assert status == 200
    assert body["message"]["payload"] == {"report": "daily", "exact": 0.1000000000000000055511151231257827,
                                          "big": 2**70}
    assert (body["message"]["headers"], body["message"]["metadata"], body["message"]["priority"]) == \
        ({"X-Job": "report"}, {"team": "ops"}, 3)
    assert len(body["next_runs"]) == 5 and all(run.endswith(("T02:00:00+00:00", "T01:00:00+00:00"))
                                               for run in body["next_runs"])  # 03:00 in Berlin

    status, body, _ = call(server, "POST", "/api/schedules/nightly/pause", admin)
    assert (status, body["changed"], body["state"], body["next_run_at"]) == (200, True, "paused", None)
    assert call(server, "POST", "/api/schedules/nightly/pause", admin)[1]["changed"] is False
    assert call(server, "GET", "/api/schedules/nightly", admin)[1]["next_runs"] == []
    status, body, _ = call(server, "POST", "/api/schedules/nightly/resume", admin)
    assert (status, body["changed"], body["state"]) == (200, True, "running") and body["next_run_at"]

    status, body, _ = call(server, "POST", "/api/schedules", admin,
                           {"name": "nightly", "cron": "@hourly", "endpoint": "orders", "replace": True})
    assert (status, body["cron"], body["time_zone"]) == (201, "0 * * * *", "UTC")
    assert scalar(conn, "SELECT payload FROM courier.schedules WHERE name = 'nightly'") == {}

    assert call(server, "DELETE", "/api/schedules/nightly", admin)[:2] == (200, {"name": "nightly", "dropped": True})
    assert scalar(conn, "SELECT count(*) FROM courier.schedules") == 0
    status, body, _ = call(server, "DELETE", "/api/schedules/nightly", admin)
    assert (status, body["error"], body["field"]) == (404, "not_found", "name")


def test_a_monitor_lists_the_schedules_in_its_scope_without_their_messages(server, conn, orders):
    conn.execute("SELECT courier.create_endpoint('billing', 'pull')")
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    for name, target in (("a-orders", "orders"), ("b-billing", "billing"), ("c-hook", "hook")):
        conn.execute("SELECT courier.create_schedule(%s, '* * * * *', %s, '{\"secret\": \"s3cr3t\"}')", (name, target))
    conn.execute("UPDATE courier.schedules SET next_run_at = now() - interval '5 minutes', last_error = 'boom', "
                 "last_error_at = now() WHERE name = 'a-orders'")
    every = tokens.create_token(conn, "grafana", topics=["*"], endpoints=["*"], actions=["monitor"])
    scoped = tokens.create_token(conn, "orders-watch", topics=["orders"], endpoints=["hook"], actions=["monitor"])
    status, body, _ = call(server, "GET", "/api/schedules", every)
    assert status == 200
    assert [s["name"] for s in body["schedules"]] == ["a-orders", "b-billing", "c-hook"]
    first = body["schedules"][0]
    assert (first["state"], first["late"], first["last_error"]) == ("failing", True, "boom")
    assert "s3cr3t" not in str(body)
    assert [s["name"] for s in call(server, "GET", "/api/schedules", scoped)[1]["schedules"]] == ["a-orders",
                                                                                                  "c-hook"]
    # Reading one whole (its message) and every change are an admin's.
    assert call(server, "GET", "/api/schedules/a-orders", every)[0] == 403
    assert call(server, "POST", "/api/schedules/a-orders/pause", every)[0] == 403
    assert call(server, "DELETE", "/api/schedules/a-orders", every)[0] == 403
    assert call(server, "POST", "/api/schedules", every, {"name": "x", "cron": "@daily", "endpoint": "orders"})[0] \
        == 403
    app = token(conn, "app", ["enqueue", "consume"])
    assert call(server, "GET", "/api/schedules", app)[0] == 403
    topics_only = token(conn, "topics-watch", ["monitor"])  # every topic, no push endpoint
    assert [s["name"] for s in call(server, "GET", "/api/schedules", topics_only)[1]["schedules"]] == \
        ["a-orders", "b-billing"]
    assert call(server, "GET", "/api/schedules")[0] == 401


def test_what_is_refused_names_its_field(server, conn, orders):
    admin = token(conn, "ops", ["admin"])
    good = {"name": "nightly", "cron": "0 3 * * *", "endpoint": "orders"}
    call(server, "POST", "/api/schedules", admin, {**good, "name": "taken"})
    for change, status, field, words in [
        ({"cron": "0 0 30 2 *"}, 400, "cron", "never comes"),
        ({"cron": "61 * * * *"}, 400, "cron", "cron"),
        ({"cron": None}, 400, "cron", "required"),
        ({"time_zone": "Nowhere/Town"}, 400, "time_zone", "IANA"),
        ({"time_zone": "UTC+3"}, 400, "time_zone", "IANA"),
        ({"endpoint": "nowhere"}, 404, "endpoint", "does not exist"),
        ({"name": "has space"}, 400, "name", "letters, digits"),
        ({"name": "taken"}, 409, "name", "already exists"),
        ({"priority": 11}, 400, "priority", "between 0 and 10"),
        ({"catch_up": "some"}, 400, "catch_up", "skip, all"),
        ({"catch_up_limit": 0}, 400, "catch_up_limit", "between 1 and 10000"),
        ({"grace_seconds": 86_401}, 400, "grace_seconds", "between 1 and 86400"),
        ({"headers": {"X-Bad": "a\nb"}}, 400, "headers.X-Bad", "control character"),
        ({"metadata": [1]}, 400, "metadata", "JSON object"),
        ({"when": "now"}, 400, "when", "unknown field"),
    ]:
        got, body, _ = call(server, "POST", "/api/schedules", admin, {**good, **change})
        assert (got, body.get("field")) == (status, field), (change, body)
        assert words in body["message"], (change, body)
    assert scalar(conn, "SELECT count(*) FROM courier.schedules") == 1
    for method, path in (("POST", "/api/schedules/nope/pause"), ("POST", "/api/schedules/nope/resume"),
                         ("GET", "/api/schedules/nope"), ("DELETE", "/api/schedules/nope")):
        got, body, _ = call(server, method, path, admin)
        assert (got, body["field"]) == (404, "name"), (method, path, body)


def test_the_routes_are_in_the_openapi_document(server, conn):
    paths = call(server, "GET", "/api/openapi.json")[1]["paths"]
    assert {"get", "post"} <= set(paths["/api/schedules"])
    assert {"get", "delete"} <= set(paths["/api/schedules/{name}"])
    assert "post" in paths["/api/schedules/{name}/pause"] and "post" in paths["/api/schedules/{name}/resume"]
    schema = paths["/api/schedules"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["name", "cron", "endpoint"]
    assert schema["properties"]["catch_up"] == {"type": "string", "enum": ["skip", "all"]}
