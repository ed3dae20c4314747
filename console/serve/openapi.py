"""GET /api/openapi.json: an OpenAPI 3.1 document made from the application's own routes and
the body fields each declares with @api, so it lists exactly what the server answers and
accepts. It needs no token: it holds no data."""

from __future__ import annotations

import re
from importlib import metadata
from typing import Any

from aiohttp import web

routes = web.RouteTableDef()

ERRORS = {"400": "bad input, naming the field", "401": "no live token", "403": "the token's scope does not allow it",
          "404": "no such topic, endpoint or message",
          "409": "lease lost, receipt of another message, key in processing, or wrong state",
          "413": "body or payload too large", "429": "the topic is full (Retry-After)",
          "431": "a header or the request line is too long",
          "503": "the database is unavailable, or a conflict worth retrying (Retry-After)"}


@routes.get("/api/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    """This document."""
    return web.json_response(document(request.app))


def document(app: web.Application) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        if route.method in ("HEAD", "*") or route.resource is None:
            continue
        path = route.resource.canonical
        paths.setdefault(path, {})[route.method.lower()] = _operation(route.method, path, route.handler)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Courier HTTP API", "version": _version(),
                 "description": "queue-ti's HTTP API over Courier (`courier serve`). Ids are strings."},
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "basic": {"type": "http", "scheme": "basic",
                                          "description": "the token's name as the user, its secret as the password"}},
            "schemas": {"Error": {"type": "object", "required": ["error", "message"],
                                  "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                                                 "field": {"type": "string"}}}},
        },
    }


def _operation(method: str, path: str, handler: Any) -> dict[str, Any]:
    declared = getattr(handler, "api", None)
    summary = (handler.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ") or path
    operation: dict[str, Any] = {
        "operationId": f"{method.lower()}{re.sub(r'[^A-Za-z0-9]+', '_', path)}".rstrip("_"),
        "summary": summary,
        "parameters": [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                       for name in re.findall(r"{(\w+)}", path)],
        "security": [{"bearer": []}, {"basic": []}] if declared else [],
        "responses": {str(declared["ok"] if declared else 200): {"description": "success"}},
    }
    if declared and declared["fields"] is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "additionalProperties": False,
            "properties": {name: check.schema for name, check in declared["fields"].items()},
            **({"required": list(declared["required"])} if declared["required"] else {})}}}}
    if declared:
        operation["responses"].update({status: {"description": why, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Error"}}}} for status, why in ERRORS.items()})
    return operation


def _version() -> str:
    try:
        return metadata.version("courier")
    except metadata.PackageNotFoundError:
        return "0"
