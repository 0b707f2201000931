"""Every documented endpoint, fuzzed from the app's own OpenAPI schema with Schemathesis.

Checks: no 5xx, status codes and bodies as the schema documents them, content types as
documented, and no stored row for a rejected request. The app runs on a fresh PostgreSQL
database holding one of everything (a delivery, a change, a run with a failure, a result
from another relay), so the read side is exercised on real rows too. The webhook intake
runs in the local-demo mode (no signature), so generated bodies reach the field checks;
the signed path is fuzzed by tests/test_fuzz.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis import BaseSchema as BaseOpenAPISchema

from ci_relay import pipeline
from ci_relay.context import RelayContext
from ci_relay.service.app import create_app
from ci_relay.settings import Settings
from ci_relay.store.models import Change, Run, Shard, TestResult
from tests import fuzzing
from tests.relay_fixtures import DISPATCH_TOKEN, FIXTURES, POLICY, fresh_postgres_database

TABLES = ("deliveries", "changes", "runs", "crcr_results")


def _seed(rt: RelayContext, client: Any) -> None:
    """One of every row the read side shows."""
    body = (FIXTURES / "pull_request/opened.payload.json").read_bytes()
    response = client.post(
        "/webhooks/github",
        content=body,
        headers={"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "seed-1"},
    )
    assert response.status_code == 202, response.text
    pipeline.process_delivery(rt, response.json()["id"])
    with rt.db.session() as session:
        run = session.query(Run).one()
        shard = Shard(run=run, index=0, test_files=["test/test_a.py::T::test_a"], runtime="sandbox")
        session.add(shard)
        session.add(TestResult(shard=shard, nodeid="test/test_a.py::T::test_a", outcome="failed"))
        assert session.query(Change).count() == 1
    response = client.post(
        "/api/crcr/results",
        content=json.dumps(fuzzing.VALID_HUD_BODY).encode(),
        headers={"x-hud-internal-bot": fuzzing.HUD_TOKEN},
    )
    assert response.status_code == 201, response.text


@pytest.fixture(scope="module")
def relay_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RelayContext, FastAPI]]:
    tmp = tmp_path_factory.mktemp("schema")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    with fresh_postgres_database() as url:
        rt = RelayContext(
            Settings(
                database_url=url,
                data_dir=tmp / "data",
                local_demo=True,  # no webhook secret: generated bodies reach validation
                dispatch_token=DISPATCH_TOKEN,  # type: ignore[arg-type]
                hud_token=fuzzing.HUD_TOKEN,  # type: ignore[arg-type]
                policy_file=policy,
            )
        )
        rt.db.upgrade()
        app = create_app(rt, lambda steps: None)
        from fastapi.testclient import TestClient

        with TestClient(app) as client:
            _seed(rt, client)
        yield rt, app
        rt.db.dispose()


@pytest.fixture(scope="module")
def api_schema(relay_app: tuple[RelayContext, FastAPI]) -> BaseOpenAPISchema:
    _, app = relay_app
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")
# A webhook body's required fields depend on the event, named in a header or in
# ``event_type``: OpenAPI cannot tie the two together, so a schema-valid ``{}`` for a
# ``pull_request`` is rightly refused (422 naming the missing field). Every other check
# applies to those endpoints too. Starlette answers an unsupported method with the Allow
# of one route per path (GET and POST of /api/crcr/results are two routes).
EXCLUDED = {
    "/webhooks/github": [schemathesis.checks.positive_data_acceptance],
    "/webhooks/dispatch": [schemathesis.checks.positive_data_acceptance],
}
AUTH = {
    "/webhooks/dispatch": {"Authorization": f"Bearer {DISPATCH_TOKEN}"},
    "/api/crcr/results": {"x-hud-internal-bot": fuzzing.HUD_TOKEN},
}


# the endpoints in four parts, each its own test: xdist spreads them over workers (each
# worker sets up its own relay, see SPREAD_OVER_WORKERS) and none runs for minutes
PARTS = {
    "webhooks": "^/webhooks/",
    "api-writes": "^/api/(crcr|upgrades)",
    "api-reads": "^/api/(?!crcr|upgrades)",
    "pages": "^/(?!webhooks/|api/)",
}
SPREAD_OVER_WORKERS = True  # the module's set-up is cheap next to its fuzzing


# where the token is a documented header parameter: a case generated without it (a negative
# case on that header) is sent without it and must be refused; any other case gets the real
# token in place of the generated one, so its body reaches the checks behind the token
HEADER_PARAMETERS = {"/api/crcr/results": "x-hud-internal-bot"}


def _auth(case: schemathesis.Case) -> dict[str, str] | None:
    if case.method != "POST" or case.path not in AUTH:
        return None
    documented = HEADER_PARAMETERS.get(case.path)
    generated = {name.lower() for name in (case.headers or {})}
    if documented is not None and documented not in generated:
        return None
    return AUTH[case.path]


def _fuzz(case: schemathesis.Case, relay_app: tuple[RelayContext, FastAPI]) -> None:
    rt, _ = relay_app
    before = fuzzing.row_counts(rt)
    response = case.call(headers=_auth(case))
    case.validate_response(
        response,
        excluded_checks=[
            *EXCLUDED.get(case.path, []),
            schemathesis.checks.allow_header_conformance,
        ],
    )
    assert response.status_code < 500, response.text
    if response.status_code >= 400 or case.method == "GET":
        after = fuzzing.row_counts(rt)
        assert {t: after[t] for t in TABLES} == {t: before[t] for t in TABLES}, (
            case.method,
            case.path,
            response.status_code,
        )


FUZZ_SETTINGS = settings(
    # bench/fuzz.py runs more through FUZZ_SCHEMA_EXAMPLES
    max_examples=int(os.environ.get("FUZZ_SCHEMA_EXAMPLES", "40")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@schema.include(path_regex=PARTS["webhooks"]).parametrize()
@FUZZ_SETTINGS
def test_every_webhook_endpoint_keeps_its_schema(
    case: schemathesis.Case, relay_app: tuple[RelayContext, FastAPI]
) -> None:
    _fuzz(case, relay_app)


@schema.include(path_regex=PARTS["api-writes"]).parametrize()
@FUZZ_SETTINGS
def test_every_api_endpoint_that_writes_keeps_its_schema(
    case: schemathesis.Case, relay_app: tuple[RelayContext, FastAPI]
) -> None:
    _fuzz(case, relay_app)


@schema.include(path_regex=PARTS["api-reads"]).parametrize()
@FUZZ_SETTINGS
def test_every_other_api_endpoint_keeps_its_schema(
    case: schemathesis.Case, relay_app: tuple[RelayContext, FastAPI]
) -> None:
    _fuzz(case, relay_app)


@schema.include(path_regex=PARTS["pages"]).parametrize()
@FUZZ_SETTINGS
def test_every_page_and_the_metrics_keep_their_schema(
    case: schemathesis.Case, relay_app: tuple[RelayContext, FastAPI]
) -> None:
    _fuzz(case, relay_app)


def test_the_parts_cover_every_endpoint_once(api_schema: BaseOpenAPISchema) -> None:
    """Fuzzing in parts must leave no path out and fuzz none twice."""
    import re

    for path in api_schema.raw_schema["paths"]:
        assert sum(bool(re.search(rx, path)) for rx in PARTS.values()) == 1, path


def test_the_schema_documents_every_route(api_schema: BaseOpenAPISchema) -> None:
    """A route the schema leaves out would be left out of the fuzzing too."""
    documented = {
        (method.upper(), path)
        for path, operations in api_schema.raw_schema["paths"].items()
        for method in operations
    }
    assert {
        ("POST", "/webhooks/github"),
        ("POST", "/webhooks/dispatch"),
        ("POST", "/api/crcr/results"),
        ("GET", "/api/runs/{run_id}"),
        ("GET", "/runs/{run_id}"),
        ("GET", "/metrics"),
    } <= documented
    github = api_schema.raw_schema["paths"]["/webhooks/github"]["post"]
    assert "requestBody" in github and {"202", "400", "401", "413", "422"} <= set(
        github["responses"]
    )
