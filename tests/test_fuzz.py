"""A bounded fuzzing campaign over every untrusted input (``bench/fuzz.py`` runs it longer).

Against the real app on a fresh PostgreSQL database (its fixed-width columns and strict
text encoding make a missed check visible as a 500): the webhook intake, the CRCR dispatch,
the HUD ingest, and the spec loader. Examples are derandomized so CI is repeatable; the
bench explores freely.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_relay.context import RelayContext
from ci_relay.request_body import _lone_surrogate
from ci_relay.service.app import create_app
from tests import fuzzing
from tests.relay_fixtures import fresh_postgres_database, make_settings

CAMPAIGN = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RelayContext, TestClient]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    with fresh_postgres_database() as url:
        rt = RelayContext(
            make_settings(
                url,
                tmp,
                hud_token=fuzzing.HUD_TOKEN,
                max_body_bytes=256 * 1024,
            )
        )
        rt.db.upgrade()
        with TestClient(create_app(rt, lambda steps: None)) as client:
            yield rt, client
        rt.db.dispose()


@CAMPAIGN
@given(request=fuzzing.webhook_requests())
def test_webhook_intake_survives_mutated_github_payloads(
    fuzz_app: tuple[RelayContext, TestClient], request: tuple[dict[str, str], bytes]
) -> None:
    rt, client = fuzz_app
    headers, body = request
    fuzzing.check_webhook(client.post, rt, headers, body, fuzzing.Tally())


@CAMPAIGN
@given(body=fuzzing.dispatch_requests())
def test_dispatch_survives_mutated_envelopes(
    fuzz_app: tuple[RelayContext, TestClient], body: bytes
) -> None:
    rt, client = fuzz_app
    fuzzing.check_dispatch(client.post, rt, body, fuzzing.Tally())


@CAMPAIGN
@given(body=fuzzing.hud_bodies())
def test_hud_ingest_survives_mutated_bodies(
    fuzz_app: tuple[RelayContext, TestClient], body: bytes
) -> None:
    rt, client = fuzz_app
    fuzzing.check_ingest(client.post, rt, body, fuzzing.Tally())


@settings(CAMPAIGN, max_examples=300)
@given(text=fuzzing.spec_texts())
def test_spec_loader_answers_file_line_col_or_a_spec(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    folder = tmp_path_factory.mktemp("spec", numbered=True)
    fuzzing.check_spec_text(text, folder, Path(folder), fuzzing.Tally())


def test_the_strategies_reach_acceptance_and_every_rejection(
    fuzz_app: tuple[RelayContext, TestClient],
) -> None:
    """The campaign is worth something only if it reaches both sides of every check."""
    rt, client = fuzz_app
    tally = fuzzing.Tally()

    @settings(CAMPAIGN, max_examples=200)
    @given(request=fuzzing.webhook_requests())
    def run(request: tuple[dict[str, str], bytes]) -> None:
        fuzzing.check_webhook(client.post, rt, *request, tally)

    run()
    assert {"202", "400", "401", "422"} <= set(tally.by_outcome), tally.by_outcome


@CAMPAIGN
@given(
    text=st.lists(
        st.one_of(
            st.sampled_from(["\\ud83d", "\\ude00", "\\\\", "\\n", '\\"', "\\u0041", "\\uDBFF"]),
            st.text(alphabet="ab\\", max_size=3),
        ),
        max_size=12,
    ).map("".join)
)
def test_the_lone_surrogate_scan_agrees_with_python(text: str) -> None:
    """The escape scanner that spares intake a walk over every body (tests what it claims)."""
    raw = ('{"k": "' + text + '"}').encode()
    try:
        data = json.loads(raw)
    except ValueError:
        return  # not JSON: parse_json refuses it before scanning
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
        lone = False
    except UnicodeEncodeError:
        lone = True
    assert _lone_surrogate(raw) is lone, raw
