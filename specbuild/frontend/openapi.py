"""The frontend's OpenAPI document (`GET /openapi.json`): FastAPI's document of the routes, with the
generation routes' request bodies declared from their pydantic models (schema.py; the routes read and
validate their bodies themselves: bounded, any content type) and every error documented as OpenAI's
error object, whatever the route's own media type."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from specbuild.frontend import schema as S


def errors_doc(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAI's error object as JSON, whatever the route's own media type (/metrics: text)."""
    schema = {"$ref": "#/components/schemas/ErrorResponse"}
    return {
        status: {"description": ERROR_TEXT[status], "content": {"application/json": {"schema": schema}}}
        for status in statuses
    }


ERROR_TEXT = {
    400: "the request is refused (OpenAI's error object names the field in `param`)",
    404: "the model is not served here, or the route does not exist",
    413: "the body is larger than 8 MiB",
    500: "an error of the frontend itself",
    503: "Triton or the engines are gone",
    504: "no response from Triton within the timeout",
}


# one server-sent event of a stream: `data:` a chunk's JSON (a response object whose choices carry deltas),
# or the final `[DONE]`
SSE_EVENT = {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}


def generation_doc(request_model, response_model) -> dict[str, Any]:
    """A generation route's OpenAPI entry: its body is read and validated by the route itself (bounded,
    any content type), so the request schema is declared here from the same pydantic model."""
    ref = {"$ref": f"#/components/schemas/{request_model.__name__}"}
    return {
        "openapi_extra": {
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}
        },
        "responses": {
            200: {
                "model": response_model,
                "description": "the answer; `stream: true`: SSE `data: {json}` chunks, then `data: [DONE]`",
                "content": {"text/event-stream": {"schema": SSE_EVENT}},
            },
            **errors_doc(400, 404, 413, 500, 503, 504),
        },
    }


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document of the routes, with the generation routes' request models in its components."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in (S.CompletionRequest, S.ChatCompletionRequest, S.ErrorResponse):
            own = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(own.pop("$defs", {}))
            schemas[model.__name__] = own
        app.openapi_schema = doc
    return app.openapi_schema
