"""The OpenAPI document as a contract a client can be generated from and a tester can walk.

Two things FastAPI does not do on its own:

* **Links.** ``POST /v1/jobs``, ``/v1/calls`` and ``/v1/leases`` answer with
  the new resource's ``id``; the document links that id to every operation
  on ``/v1/<resource>/{<resource>_id}``, so a generated client (and a
  stateful tester) knows where the id goes next.
* **Unknown query parameters** are refused (422), as unknown body fields are:
  a misspelt ``?stat=uncertain`` must not silently list everything.
* **Allow.** Starlette answers 405 with the methods of the one route it
  matched; a path served by several routes (GET and DELETE of a job) lists
  them all, as RFC 9110 asks.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

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


HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method the document serves at ``path`` (for a 405's ``Allow``); read from the
    document itself, so the header and the contract cannot disagree."""
    methods: set[str] = set()
    for template, operations in app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            methods |= {m.upper() for m in operations if m in HTTP_METHODS}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route takes, its dependencies' included."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= query_names(sub)
    return names


def no_unknown_query(request: Request) -> None:
    """Refuse a query parameter the route does not declare (a dependency of every route).

    Raises:
        RequestValidationError: answered as a 422 in the API's one error shape.
    """
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known = query_names(route.dependant)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise RequestValidationError(
            [
                {
                    "loc": ("query", name),
                    "msg": f"unknown query parameter {name!r}"
                    + (f"; this route takes {', '.join(sorted(known))}" if known else ""),
                    "type": "extra_forbidden",
                }
                for name in unknown
            ]
        )
