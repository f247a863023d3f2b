"""Schemathesis against the OpenAI frontend's own OpenAPI document (/openapi.json), on a real tritonserver
(the draft/target repository, a chat template so chat answers too): generated valid and invalid requests to
every route; no 5xx, every 4xx in OpenAI's error shape, every response as documented (status, content
type, headers, JSON schema), invalid bodies refused.

Bounded and seeded in `make test` (FUZZ_EXAMPLES per route, default below); `make fuzz` runs it longer.
Generated bodies ask for the served model (a random id is only ever a 404, covered elsewhere) and at most
MAX_TOKENS tokens, so hundreds of generations fit in a minute; lengths are tested by the e2e tests."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as fixed_seed
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))  # per route and phase; `make fuzz` raises it
SEED = int(os.environ.get("FUZZ_SEED", "20261204"))
MAX_TOKENS = 8
MODEL = "dt"
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
COUNTS = {"cases": 0, "by_status": {}}


@pytest.fixture(scope="module")
def openai_schema(e2e_servers, tmp_path_factory):
    from specbuild.frontend.run import FrontendOptions, start_frontend
    from specbuild.serve.tritonserver import free_port

    template = tmp_path_factory.mktemp("fuzz") / "template.jinja"
    template.write_text(TEMPLATE)
    dt = e2e_servers["draft_target"]
    options = FrontendOptions(
        port=free_port(),
        chat_template=template,
        metrics_url=f"http://{dt.options.host}:{dt.options.metrics_port}/metrics",
    )
    frontend = start_frontend(dt.grpc_url, options, default_name=MODEL)
    base = frontend.url.removesuffix("/v1")
    yield schemathesis.openapi.from_url(f"{base}/openapi.json")
    frontend.stop()
    print(f"\nschemathesis: {COUNTS['cases']} requests, statuses {sorted(COUNTS['by_status'].items())}")


def _bounded(body):
    """The served model and a short generation, where the generated body has those fields right-typed."""
    if not isinstance(body, dict):  # also schemathesis' NotSet (a route without a body)
        return body
    if isinstance(body.get("model"), str):
        body["model"] = MODEL
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int) and not isinstance(body[key], bool) and body[key] > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if "messages" in body and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_completion_tokens"] = MAX_TOKENS  # chat's default is "all that fit"
    return body


def test_the_frontend_answers_every_generated_request_as_documented(openai_schema):
    """Valid and invalid requests to every route, mixed, EXAMPLES x routes of them, seeded."""
    cases = st.one_of(
        openai_schema.as_strategy(GenerationMode.POSITIVE), openai_schema.as_strategy(GenerationMode.NEGATIVE)
    )
    routes = len(list(openai_schema.get_all_operations()))

    @fixed_seed(SEED)
    @settings(
        max_examples=EXAMPLES * routes,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def run(case):
        case.body = _bounded(case.body)
        response = case.call_and_validate(checks=CHECKS, timeout=120)
        COUNTS["cases"] += 1
        COUNTS["by_status"][response.status_code] = COUNTS["by_status"].get(response.status_code, 0) + 1
        if 400 <= response.status_code < 500:
            error = response.json()["error"]  # OpenAI's shape on every 4xx
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "invalid_request_error" and len(response.content) < 4096  # bounded echo

    run()
    assert COUNTS["by_status"].get(200, 0) > EXAMPLES  # the generations reached the engines
