"""The OpenAPI document as a contract a client can be generated from and a tester can walk.

Two things FastAPI does not do on its own:

* **Links.** ``POST /v1/jobs``, ``/v1/calls`` and ``/v1/leases`` answer with
  the new resource's ``id``; the document links that id to every operation
  on ``/v1/<resource>/{<resource>_id}``, so a generated client (and a
  stateful tester) knows where the id goes next.
* **Allow.** Starlette answers 405 with the methods of the one route it
  matched; a path served by several routes (GET and DELETE of a job) lists
  them all, as RFC 9110 asks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Scope

CREATED_BY = {"/v1/jobs": "job_id", "/v1/calls": "call_id", "/v1/leases": "lease_id"}


def install_links(app: FastAPI) -> None:
    """Serve the document with links from each creating POST to its resource's operations."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=None
            )
            add_links(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def add_links(schema: dict[str, Any]) -> None:
    """Link each creating POST's ``id`` to the operations that take it as a path parameter."""
    paths: dict[str, dict[str, Any]] = schema.get("paths", {})
    for collection, param in CREATED_BY.items():
        create = paths.get(collection, {}).get("post")
        if create is None:
            continue
        links = {
            f"{op['operationId']}": {
                "operationId": op["operationId"],
                "parameters": {param: "$response.body#/id"},
            }
            for path, ops in paths.items()
            if path.startswith(f"{collection}/{{{param}}}")
            for op in ops.values()
            if isinstance(op, dict) and "operationId" in op
        }
        for status, answer in create.get("responses", {}).items():
            if status.startswith("2"):
                answer["links"] = links


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> list[str]:
    """Every method some route serves at this request's path (for a 405's ``Allow``)."""
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches({**scope, "method": next(iter(route.methods))})
            if match is Match.FULL:
                methods |= route.methods
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)
