"""The wire API as an OpenAPI 3.1 document (`GET /openapi.json`), generated from the msgspec
structs in wire.py (msgspec.json.schema_components): the schema the server checks every request
against is the one published, constraints included, so a tool that reads the document
(schemathesis in tests/test_schemathesis.py) tests the server as it really is."""

from __future__ import annotations

import inspect
from typing import Any

import msgspec

from .. import __version__
from . import wire

_REF = "#/components/schemas/{name}"
_ERRORS = {
    "400": "malformed or out-of-range request (the message says which field)",
    "401": "missing or wrong token",
    "404": "no such session (it ended, was evicted or the server restarted)",
    "408": "the body did not arrive within --body-timeout",
    "409": "the session is busy or out of step with the client",
    "413": "the body or the clip is over its limit",
    "429": "too many of this token's requests were refused (over --max-refusals-per-s; see Retry-After)",
    "431": "the request head is over 64 KiB",
    "503": "every session or connection is busy (see Retry-After)",
}


def _errors(*codes: str) -> dict[str, Any]:
    """Every operation may be answered 401, 429 and 431 before it is routed (gate.py)."""
    error = {"application/json": {"schema": {"$ref": _REF.format(name="ErrorBody")}}}
    return {code: {"description": _ERRORS[code], "content": error} for code in codes}


def _message(name: str, description: str) -> dict[str, Any]:
    """A body or answer in both encodings: MessagePack (the client's; bytes as bin) or JSON (bytes
    as base64)."""
    schema = {"$ref": _REF.format(name=name)}
    return {"description": description, "content": {wire.MSGPACK: {"schema": schema}, wire.JSON: {"schema": schema}}}


def document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [wire.VerifyRequest, wire.VerifyResponse, wire.GenerateRequest, wire.GenerateResponse, wire.ErrorBody,
         wire.Health, wire.Closed, wire.OpenRequest, wire.Opened], ref_template=_REF)
    # Docstrings as inspect.cleandoc gives them: msgspec versions differ in whether they dedent
    # them, and docs/openapi.json must be the same document whichever one built it.
    for schema in components.values():
        if "description" in schema:
            schema["description"] = inspect.cleandoc(schema["description"])
    json_of = lambda name: {"application/json": {"schema": {"$ref": _REF.format(name=name)}}}  # noqa: E731
    paths = {
        "/health": {"get": {
            "operationId": "health", "summary": "What the server hosts and how it is set up",
            "responses": {"200": {"description": "the server is up", "content": json_of("Health")}, **_errors("401", "429", "431")}}},
        "/metrics": {"get": {
            "operationId": "metrics", "summary": "Prometheus metrics (text format)",
            "responses": {"200": {"description": "the metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                          **_errors("401", "429", "431")}}},
        "/openapi.json": {"get": {
            "operationId": "openapi", "summary": "This document",
            "responses": {"200": {"description": "the OpenAPI document",
                                  "content": {"application/json": {"schema": {"type": "object"}}}},
                          **_errors("401", "429", "431")}}},
        "/v1/verify": {"post": {
            "operationId": "verify",
            "summary": "Open a session (with the clip and the decoding settings) and/or verify a draft in it",
            "description": "The answer is MessagePack unless the request's Accept header asks for JSON only.",
            "requestBody": {"required": True, **_message("VerifyRequest", "the draft, and to open a session the clip")},
            "responses": {"200": _message("VerifyResponse", "the verdict"),
                          **_errors("400", "401", "404", "408", "409", "413", "503", "429", "431")}}},
        "/v1/generate": {"post": {
            "operationId": "generate", "summary": "Cloud-only: the whole description in one request",
            "requestBody": {"required": True, **_message("GenerateRequest", "the clip and the decoding settings")},
            "responses": {"200": _message("GenerateResponse", "the description's tokens and the work counters"),
                          **_errors("400", "401", "408", "413", "429", "431")}}},
        "/v1/sessions": {"post": {
            "operationId": "open",
            "summary": "Open a session with the clip and run its prefill now (the client's --upload eager)",
            "requestBody": {"required": True, **_message("OpenRequest", "the clip and the decoding settings")},
            "responses": {"200": _message("Opened", "the session, prefilled"),
                          **_errors("400", "401", "408", "413", "503", "429", "431")}}},
        "/v1/sessions/{sid}": {"delete": {
            "operationId": "close", "summary": "Close a session",
            "parameters": [{"name": "sid", "in": "path", "required": True,
                            "schema": {"type": "string", "minLength": 1, "maxLength": wire.MAX_SESSION_ID}}],
            "responses": {"200": {"description": "closed", "content": json_of("Closed")},
                          **_errors("401", "404", "409", "429", "431")}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "specdec serve", "version": __version__,
                 "description": f"Wire protocol {wire.PROTOCOL}: the cloud thinker of edge-cloud speculative decoding. "
                                "Every request carries `Authorization: Bearer <token>` when the server has tokens."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }


if __name__ == "__main__":  # python -m specdec_cli.remote.openapi > docs/openapi.json
    import json
    import sys

    sys.stdout.write(json.dumps(document(), indent=1, ensure_ascii=False) + "\n")
