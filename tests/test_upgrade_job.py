"""The relay's release upgrade job: ``POST /api/upgrades`` plans the A..B diff, runs the
changed tests at A and at B, and the comparison page says what newly fails; checked over
HTTP and in a real browser."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import expect, sync_playwright
from sqlalchemy import func, select

from ci_relay.context import RelayContext
from ci_relay.service.app import create_app
from ci_relay.steps import Next
from ci_relay.store.models import Change, OutboxMessage, Run, Upgrade
from tests.conftest import CliResult
from tests.gitrepo import GitRepo
from tests.relay_fixtures import DISPATCH_TOKEN, drain, served_app, upstream_context
from tests.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.slow

SPEC = """\
# the ops we reuse
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_ops.py
      unlisted_test_mode: mandatory_success
      tests:
        - names: [TestOps::test_old_name]  # renamed at B
          mode: mandatory_success
"""
TESTS_A = """
from helpers import scale


class TestOps:
    def test_stays_green(self):
        assert 1 == 1

    def test_breaks(self):
        assert 2 + 2 == 4

    def test_gets_fixed(self):
        assert 2 + 2 == 5

    def test_old_name(self):
        assert scale(2) == 4

    def test_unrelated(self):
        assert True
"""
TESTS_B = (
    TESTS_A.replace("assert 2 + 2 == 4", "assert 2 + 2 == 22")
    .replace("assert 2 + 2 == 5", "assert 2 + 2 == 4")
    .replace("test_old_name", "test_new_name")
    + """
    def test_added(self):
        assert scale(1) == 2
"""
)
HELPERS = "def scale(x):\n    return 2 * x\n"


@dataclass
class Submitted:
    rt: RelayContext
    client: TestClient
    upgrade_id: int
    base: str
    head: str


@pytest.fixture(scope="module")
def submitted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Submitted]:
    tmp = tmp_path_factory.mktemp("upgrade-job")
    repo = GitRepo(tmp / "upstream")
    base = repo.commit("release A", {"test/test_ops.py": TESTS_A, "test/helpers.py": HELPERS})
    repo.commit("work", {"README.md": "x\n"})
    head = repo.commit("release B", {"test/test_ops.py": TESTS_B})
    # the test's own upstream: running it unisolated is a person's choice, as the settings say
    rt = upstream_context(
        tmp,
        repo.path,
        SPEC,
        runtime="local",
        dispatch_token=DISPATCH_TOKEN,
        crcr_callback_url="http://127.0.0.1:9/never-called",
    )
    steps: list[Next] = []
    with TestClient(create_app(rt, steps.extend)) as client:
        response = client.post(
            "/api/upgrades",
            json={"repository": "sample/pytorch", "base": base, "head": head},
            headers={"Authorization": f"Bearer {DISPATCH_TOKEN}"},
        )
        assert response.status_code == 202, response.text
        assert steps == [Next("upgrade", response.json()["id"])]
        drain(rt, steps)
        yield Submitted(rt, client, response.json()["id"], base, head)


def _rows(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (cpu,) = view["backends"]
    return {row["test"].rsplit("::", 1)[-1]: row for row in cpu["rows"]}


def test_the_comparison_says_what_newly_fails(submitted: Submitted) -> None:
    view = submitted.client.get(f"/api/upgrades/{submitted.upgrade_id}").json()
    assert view["state"] == "running" and view["need_run"] == 4
    (cpu,) = view["backends"]
    assert cpu["finished"] is True
    rows = _rows(view)
    assert rows["test_breaks"]["category"] == "newly failing"
    assert (rows["test_breaks"]["base"], rows["test_breaks"]["head"]) == ("passed", "failed")
    assert rows["test_gets_fixed"]["category"] == "newly passing"
    assert rows["test_added"]["category"] == "not run" and rows["test_added"]["base"] is None
    # renamed between A and B: one row, matched under its new name, passing at both
    assert rows["test_new_name"]["category"] == "passing"
    assert (
        rows["test_new_name"]["base"] == "passed" and rows["test_new_name"]["change"] == "renamed"
    )
    assert "test_stays_green" not in rows and "test_unrelated" not in rows  # nothing changed
    assert cpu["counts"] == {
        "newly failing": 1,
        "newly passing": 1,
        "still failing": 0,
        "not run": 1,
        "passing": 1,
    }
    patch = submitted.client.get(f"/upgrades/{submitted.upgrade_id}/patch")
    assert patch.headers["content-type"].startswith("text/x-diff")
    assert "+        - names: [TestOps::test_new_name]  # renamed at B" in patch.text
    with submitted.rt.db.session() as s:
        kinds = set(s.scalars(select(Change.kind)))
        assert kinds == {"upgrade"}
        assert s.scalar(select(func.count(Run.id))) == 2
        # the runs test a release range for the spec's maintainers: nothing is reported upstream
        assert s.scalar(select(func.count(OutboxMessage.id))) == 0
    grid = submitted.client.get("/").text
    assert f'data-upgrade="{submitted.upgrade_id}"' in grid and "1 newly failing" in grid
    api_grid = submitted.client.get("/api/grid").json()
    assert api_grid["rows"] == [] and api_grid["upgrades"][0]["id"] == submitted.upgrade_id


@pytest.mark.parametrize(
    ("body", "headers", "status", "message"),
    [
        ({}, {}, 401, "bad bearer token"),
        ({"repository": "sample/pytorch", "base": "abc", "head": "abc"}, None, 422, "base"),
        ({"repository": "nobody/else", "base": "a" * 40, "head": "b" * 40}, None, 422, "allowlist"),
        (
            {
                "repository": "sample/pytorch",
                "base": "a" * 40,
                "head": "b" * 40,
                "backends": ["tpu"],
            },
            None,
            422,
            "backends tpu do not run",
        ),
        (  # a hyphenated name is a valid backend name; the policy decides
            {
                "repository": "sample/pytorch",
                "base": "a" * 40,
                "head": "b" * 40,
                "backends": ["spyre-emu"],
            },
            None,
            422,
            "backends spyre-emu do not run",
        ),
        (
            {
                "repository": "sample/pytorch",
                "base": "a" * 40,
                "head": "b" * 40,
                "backends": ["$(x)"],
            },
            None,
            422,
            "backends",
        ),
        (
            {"repository": "sample/pytorch", "base": "a" * 40, "head": "b" * 40, "x": 1},
            None,
            422,
            "x",
        ),
        ("[", None, 400, "not JSON"),
    ],
)
def test_bad_upgrade_requests_are_refused(
    submitted: Submitted, body: Any, headers: dict[str, str] | None, status: int, message: str
) -> None:
    auth = {"Authorization": f"Bearer {DISPATCH_TOKEN}"} if headers is None else headers
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, str) else {"json": body}
    response = submitted.client.post("/api/upgrades", headers=auth, **kwargs)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


def test_an_upgrade_of_an_unknown_commit_fails_with_its_reason(submitted: Submitted) -> None:
    steps: list[Next] = []
    with TestClient(create_app(submitted.rt, steps.extend)) as client:
        response = client.post(
            "/api/upgrades",
            json={"repository": "sample/pytorch", "base": submitted.base, "head": "f" * 40},
            headers={"Authorization": f"Bearer {DISPATCH_TOKEN}"},
        )
        drain(submitted.rt, steps)
        view = client.get(f"/api/upgrades/{response.json()['id']}").json()
    assert view["state"] == "failed" and "f" * 40 in view["error"]


@pytest.fixture(scope="module")
def served(submitted: Submitted) -> Iterator[str]:
    """The relay app behind a real HTTP server (what a browser and the CLI talk to)."""
    with served_app(submitted.rt) as url:
        yield url


@pytest.mark.browser
def test_the_comparison_page_in_a_browser(
    submitted: Submitted, served: str, tmp_path: Path
) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{served}/")
        page.locator(f'tr[data-upgrade="{submitted.upgrade_id}"] a').first.click()
        expect(page.locator("h1")).to_contain_text(f"Release upgrade {submitted.upgrade_id}")
        expect(page.locator(".headline")).to_contain_text("4 of 6")
        failing = page.locator('tr.comparison-row[data-category="newly failing"]')
        expect(failing).to_have_count(1)
        expect(failing).to_contain_text("test_breaks")
        expect(page.locator('tr.comparison-row[data-category="newly passing"]')).to_contain_text(
            "test_gets_fixed"
        )
        page.locator("a.patch-link").click()
        expect(page.locator("body")).to_contain_text("TestOps::test_new_name")
        page.screenshot(path=str(tmp_path / "upgrade.png"))
        browser.close()


def test_the_command_line_submits_an_upgrade(
    cli: Callable[..., CliResult], submitted: Submitted, served: str
) -> None:
    upstream = submitted.rt.settings.upstream_repo
    assert upstream is not None
    args = ("upgrade", "--upstream", upstream, "--from", "HEAD~2", "--to", "HEAD")
    no_token = cli(*args, "--submit", served, "--repository", "sample/pytorch")
    assert no_token.code == 2 and "CI_RELAY_DISPATCH_TOKEN" in no_token.stderr
    env = {"CI_RELAY_DISPATCH_TOKEN": DISPATCH_TOKEN}
    refused = cli(*args, "--submit", served, "--repository", "nobody/else", env=env)
    assert refused.code == 2 and "not in the allowlist" in refused.stderr
    result = cli(*args, "--submit", served, "--repository", "sample/pytorch", env=env)
    assert result.code == 0, result.output
    assert f"{served}/upgrades/" in result.stdout
    with submitted.rt.db.session() as s:
        job = s.scalars(select(Upgrade).order_by(Upgrade.id.desc())).first()
        assert job is not None and (job.base_sha, job.head_sha) == (submitted.base, submitted.head)
