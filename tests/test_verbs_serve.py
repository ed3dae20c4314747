"""Issue 42's verbs over `courier serve`, for admin tokens: cancel by id and by key, delete by id,
and purge a topic (or its DLQ); errors name their field, other tokens get a 403."""
# ruff: noqa: F811  (the `server` and `orders` fixtures come from test_serve, by import)

from __future__ import annotations

from tests.helpers import message_status, scalar
from tests.test_serve import b64, call, orders, server, token  # noqa: F401


def test_cancel_delete_and_purge_for_admin_tokens_only(server, conn, orders):
    admin = token(conn, "ops", ["admin"])
    app = token(conn, "app", ["enqueue", "consume"])
    ids = [int(call(server, "POST", "/api/messages", app,
                    {"topic": "orders", "payload": b64(n), "key": f"k{n}"})[1]["id"]) for n in range(5)]

    assert call(server, "POST", f"/api/messages/{ids[0]}/cancel", app)[0] == 403
    status, body, _ = call(server, "POST", f"/api/messages/{ids[0]}/cancel", admin)
    assert (status, body) == (200, {"id": str(ids[0]), "endpoint": "orders", "was": "pending", "result": "cancelled"})
    assert message_status(conn, ids[0]) == "cancelled"
    assert scalar(conn, "SELECT details ->> 'by' FROM courier.event_log WHERE event_type = 'message.cancelled'") \
        == "http:ops"

    status, body, _ = call(server, "POST", "/api/messages/cancel", admin, {"endpoint": "orders", "key": "k1"})
    assert status == 200 and body["cancelled"] == [
        {"id": str(ids[1]), "endpoint": "orders", "was": "pending", "result": "cancelled"}]

    assert call(server, "DELETE", f"/api/messages/{ids[2]}", app)[0] == 403
    status, body, _ = call(server, "DELETE", f"/api/messages/{ids[2]}", admin)
    assert (status, body) == (200, {"id": str(ids[2]), "was": "pending", "result": "deleted"})
    assert message_status(conn, ids[2]) is None

    (leased,) = call(server, "POST", "/api/messages/dequeue", app, {"topic": "orders"})[1]["messages"]
    assert call(server, "POST", "/api/topics/orders/purge", app)[0] == 403
    status, body, _ = call(server, "POST", "/api/topics/orders/purge", admin, {"archive": False})
    assert (status, body) == (200, {"topic": "orders", "purged": 1, "dlq": False, "archived": False})
    assert message_status(conn, int(leased["id"])) == "processing"  # never one in processing
    status, body, _ = call(server, "DELETE", f"/api/messages/{leased['id']}", admin)
    assert status == 409 and body["field"] == "id" and "in processing" in body["message"]
    status, body, _ = call(server, "POST", "/api/topics/orders.dlq/purge", admin)
    assert (status, body["purged"], body["dlq"]) == (200, 0, True)


def test_errors_name_the_field(server, conn, orders):
    admin = token(conn, "ops", ["admin"])
    status, body, _ = call(server, "POST", "/api/messages/987654/cancel", admin)
    assert (status, body["error"], body["field"]) == (404, "not_found", "id")
    assert body["message"] == "id: message 987654 does not exist"
    assert call(server, "DELETE", "/api/messages/987654", admin)[1]["field"] == "id"
    status, body, _ = call(server, "POST", "/api/messages/abc/cancel", admin)
    assert (status, body["field"]) == (400, "id")
    status, body, _ = call(server, "POST", "/api/messages/cancel", admin, {"endpoint": "orders"})
    assert (status, body["field"]) == (400, "key")
    status, body, _ = call(server, "POST", "/api/messages/cancel", admin, {"endpoint": "orders", "key": "none"})
    assert (status, body["field"]) == (404, "key")
    status, body, _ = call(server, "POST", "/api/topics/nowhere/purge", admin)
    assert (status, body["field"]) == (404, "endpoint")
    status, body, _ = call(server, "POST", "/api/topics/orders/purge", admin, {"dlq": "yes"})
    assert (status, body["field"]) == (400, "dlq")
    for path, fields in (("/api/topics/orders/purge", {"dlq": True, "archive": False}),
                         ("/api/topics/orders.dlq/purge", {"archive": False})):
        status, body, _ = call(server, "POST", path, admin, fields)
        assert (status, body["field"]) == (400, "archive"), path
    sent = int(call(server, "POST", "/api/messages", admin, {"topic": "orders", "payload": b64(1)})[1]["id"])
    call(server, "POST", f"/api/messages/{sent}/cancel", admin)
    conn.execute("SELECT courier.archive_completed_messages(0)")
    assert call(server, "DELETE", f"/api/messages/{sent}", admin)[0] == 409  # finished: in the archive


def test_the_routes_are_in_the_openapi_document(server, conn):
    admin = token(conn, "ops", ["admin"])
    paths = call(server, "GET", "/api/openapi.json", admin)[1]["paths"]
    assert "post" in paths["/api/messages/{id}/cancel"] and "delete" in paths["/api/messages/{id}"]
    assert "post" in paths["/api/messages/cancel"] and "post" in paths["/api/topics/{name}/purge"]
