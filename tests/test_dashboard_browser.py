"""The dashboard in a real browser, after a real pipeline run of the sample upstream.

The relay runs as ``ci-relay serve`` (uvicorn + embedded worker, SQLite) exactly as
the demo starts it, with a spec under which two upstream tests the sample change adds
fail. Headless Debian Chromium (through Playwright, never its own browser download)
then walks the pages a developer would: grid → failing cell → run → selection
explanation → failure → test history → commit page → trends. Screenshots go to
``artifacts/screenshots/``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, expect, sync_playwright

from ci_relay.demo import DemoRelay, free_port, pull_request_payload, send_webhook, wait_for_run
from ci_relay.sample_upstream import SampleUpstream
from ci_relay.store.database import Database
from ci_relay.store.models import Change, Delivery, Run, Shard, TestResult

pytestmark = [pytest.mark.slow, pytest.mark.browser]

REPO_ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO_ROOT / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# every test of the file must pass, so the two the sample change adds fail on the backend
FAILING_SPEC = """
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_binary_ufuncs.py
      unlisted_test_mode: mandatory_success
"""
CHANGE_INDEX = 4  # "Add prod and floor_divide refs; test prod precision and floor_divide rounding"
FLOOR_TEST = "test/test_binary_ufuncs.py::TestBinaryUfuncs::test_floor_divide_rounds_toward_zero"
FLOOR_VARIANT = (
    "test/test_binary_ufuncs.py::TestBinaryUfuncsCPU::test_floor_divide_rounds_toward_zero_cpu"
)
EVIL = "<script>window.__pwned = 1; alert('pwned')</script>"


class FailingSpecRelay(DemoRelay):
    """The demo's relay, told to run the strict spec, the local agent (which the backtest
    may set aside) and no sandbox."""

    spec: Path

    def env(self, sample: SampleUpstream) -> dict[str, str]:
        env = super().env(sample)
        env.update(
            CI_RELAY_SPECS=f'["{self.spec}"]',
            CI_RELAY_SELECTION_AGENT="local",
            CI_RELAY_RUNTIME="local",
            # budgets are never exceeded: room for both tests the change adds, not the file
            CI_RELAY_SELECTION_BUDGET="40%",
        )
        return env


@dataclass
class ServedRun:
    url: str
    head: str
    run_id: int
    database_url: str


@pytest.fixture(scope="module")
def served_run(
    tmp_path_factory: pytest.TempPathFactory, sample_upstream: SampleUpstream
) -> Iterator[ServedRun]:
    """One real pipeline run (select, execute, collect) on a live relay, kept serving."""
    workdir = tmp_path_factory.mktemp("dashboard-relay")
    relay = FailingSpecRelay(workdir, free_port(), "browser-test-secret", backends=("cpu",))
    relay.spec = workdir / "strict.yaml"
    relay.spec.write_text(FAILING_SPEC)
    log = workdir / "relay.log"
    relay.start(sample_upstream, log)
    try:
        relay.wait_ready()
        payload = pull_request_payload(sample_upstream, CHANGE_INDEX)
        response = send_webhook(relay.url, relay.secret, "pull_request", payload)
        assert response.status_code == 202, response.text
        try:
            change = wait_for_run(relay.url, response.json()["delivery_id"], timeout=420)
        except TimeoutError:
            pytest.fail("the run did not finish:\n" + log.read_text(errors="replace")[-4000:])
        (run,) = change["runs"]
        assert run["conclusion"] == "failure", run
        yield ServedRun(
            relay.url,
            payload["after"],
            run["id"],
            f"sqlite:///{(workdir / 'data' / 'relay.db').resolve()}",
        )
    finally:
        relay.stop()


@dataclass
class Watched:
    page: Page
    dialogs: list[str]
    errors: list[str]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield instance
        instance.close()


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    """A page that records alert dialogs and script errors (neither may happen)."""
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    seen = Watched(page, [], [])

    def on_dialog(dialog: Dialog) -> None:
        seen.dialogs.append(dialog.message)
        dialog.dismiss()

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            seen.errors.append(message.text)

    page.on("dialog", on_dialog)
    page.on("console", on_console)
    page.on("pageerror", lambda exc: seen.errors.append(str(exc)))
    yield seen
    context.close()


def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def test_from_the_grid_to_a_failure_and_why_its_test_was_selected(
    served_run: ServedRun, watched: Watched
) -> None:
    page = watched.page
    page.goto(served_run.url + "/")
    expect(page).to_have_title(re.compile("Grid"))
    row = page.locator(f'tr[data-sha="{served_run.head}"]')
    cell = row.locator('td[data-backend="cpu"]')
    expect(cell).to_have_attribute("data-status", "failure")
    # the two added tests fail; the others the 40 % budget lets in (how many depends on the
    # ranking) pass
    expect(cell).to_contain_text("2 fail")
    expect(cell).to_contain_text(re.compile(r"[1-9]\d* pass"))
    counts = re.search(r"(\d+) fail\s*(\d+) pass", cell.inner_text())
    assert counts is not None, cell.inner_text()
    passed = int(counts[2])
    pass_rate = f"{100 * passed / (passed + int(counts[1])):.1f}%"  # the trends page's figure
    shot(page, "01-grid.png")

    # the failing cell leads to its run
    cell.locator("a").click()
    expect(page).to_have_url(f"{served_run.url}/runs/{served_run.run_id}")
    expect(page.locator("h1")).to_contain_text(f"Run {served_run.run_id}")
    failures = page.locator("ol.failures > li")
    expect(failures).to_have_count(2)
    floor = failures.filter(has_text="test_floor_divide_rounds_toward_zero_cpu")
    expect(floor).to_contain_text("AssertionError")
    expect(floor.locator(".badge.outcome-failed")).to_be_visible()
    # the sample upstream's history is too short to replay the local agent on: it steps
    # aside and the page says why (its evidence rendering: test_dashboard.py)
    expect(page.locator("#selection ~ ul.notes")).to_contain_text("local agent skipped")
    shot(page, "02-run.png")

    # the selection explanation of the test behind that failure, stage by stage
    planned = page.locator(f'tr.planned-test[data-test="{FLOOR_TEST}"]')
    expect(planned.locator("td.variants")).to_contain_text("failed")
    why = planned.locator("details.why")
    expect(why.locator(".stage-candidates")).to_be_hidden()
    why.locator("summary").click()
    expect(why).to_have_attribute("open", "")
    candidates = why.locator(".stage-candidates")
    expect(candidates).to_be_visible()
    expect(candidates).to_contain_text("edited-by-change")
    expect(candidates).to_contain_text("the change adds this test")
    expect(candidates).to_contain_text("references-change")
    expect(why.locator(".stage-agent")).to_have_count(0)
    expect(why.locator(".stage-plan")).to_contain_text("budget")
    expect(page.locator("#excluded")).to_contain_text("Left out")
    left_out = page.locator("#excluded ~ table.planned").last.locator("tr.planned-test")
    assert left_out.count() > 0
    why.scroll_into_view_if_needed()
    shot(page, "03-selection.png")

    # the failure's own record: its test's history across commits
    floor.locator("a.nodeid").click()
    expect(page).to_have_url(re.compile(r"/tests\?nodeid="))
    expect(page.locator(".nodeid-title")).to_have_text(FLOOR_VARIANT)
    expect(page.locator("table.history tbody tr")).to_have_count(1)
    expect(page.locator("table.history")).to_contain_text("failed")
    expect(page.locator(".flake-rate")).to_have_text("0.0%")
    expect(page.locator("figure.chart svg circle")).to_have_count(1)
    shot(page, "04-test.png")

    # the commit page, and from there back to the failure by its link
    page.locator("table.history a[href^='/commits/']").first.click()
    expect(page).to_have_url(f"{served_run.url}/commits/{served_run.head}")
    expect(page.locator("table.changes")).to_contain_text("floor_divide rounding")
    commit_failure = page.locator("li.failure").filter(has_text="test_floor_divide_rounds")
    expect(commit_failure).to_contain_text("Tensor-likes are not equal")
    shot(page, "05-commit.png")
    commit_failure.locator("a.permalink").click()
    expect(page).to_have_url(re.compile(rf"/runs/{served_run.run_id}#failure-\d+$"))
    target = page.url.rsplit("#", 1)[1]
    expect(page.locator(f"#{target}")).to_contain_text("test_floor_divide_rounds_toward_zero_cpu")

    page.locator("header nav a", has_text="Trends").click()
    expect(page.locator("figure.chart svg")).to_have_count(3)
    expect(page.locator("dl.summary")).to_contain_text(pass_rate)  # as the grid counted
    shot(page, "06-trends.png")
    assert watched.dialogs == [] and watched.errors == []


def _stored_push_run(
    served_run: ServedRun,
    head: str,
    title: str,
    state: str,
    results: list[TestResult],
    log_tail: str | None = None,
) -> int:
    """A push and its cpu run with one shard holding ``results``, written straight into the
    served relay's database (what the pipeline would store); the run's id."""
    db = Database(served_run.database_url)
    with db.session() as session:
        delivery = Delivery(
            source="github",
            hook_id=head[:8],
            delivery_id=f"stored-{head[:8]}",
            event="push",
            repository="sample/pytorch",
            head_sha=head,
            state="processed",
            body=json.dumps({"head_commit": {"message": title}}).encode(),
        )
        change = Change(delivery=delivery, repository="sample/pytorch", kind="push", head_sha=head)
        done = state == "completed"
        run = Run(
            change=change,
            backend="cpu",
            level="L2",
            state=state,
            conclusion="failure" if done else None,
        )
        shard = Shard(
            run=run,
            index=0,
            test_files=sorted({r.nodeid.split("::")[0] for r in results}),
            state="done",
            log_tail=log_tail,
        )
        for result in results:
            result.shard = shard
        session.add_all(results)
        session.flush()
        run_id = int(run.id)
    db.dispose()
    return run_id


def test_markup_in_a_test_name_never_runs_in_the_browser(
    served_run: ServedRun, watched: Watched
) -> None:
    """A stored test name, message and log line carrying a script stay text on every page."""
    nodeid = f"test/test_evil.py::TestEvil::test_{EVIL}"
    # still running: it shows on the grid and its pages, but not in the trends
    run_id = _stored_push_run(
        served_run,
        "e" * 40,
        "<script>alert(1)</script> title",
        "running",
        [TestResult(nodeid=nodeid, outcome="failed", message=EVIL)],
        log_tail=EVIL,
    )

    page = watched.page
    for path in ("/", f"/commits/{'e' * 40}", f"/runs/{run_id}"):
        page.goto(served_run.url + path)
        expect(page.locator("main")).to_be_visible()
    expect(page.locator("li.failure a.nodeid")).to_have_text(nodeid)
    expect(page.locator("li.failure pre.message")).to_have_text(EVIL)
    shot(page, "07-escaped-test-name.png")
    page.locator("li.failure a.nodeid").click()
    expect(page.locator(".nodeid-title")).to_have_text(nodeid)
    assert page.evaluate("window.__pwned === undefined")
    assert watched.dialogs == [] and watched.errors == []


def test_a_run_with_a_thousand_failures_reads_a_page_at_a_time(
    served_run: ServedRun, watched: Watched
) -> None:
    """1,100 failures with long tracebacks: the run page shows the first 50, folded; the
    next link walks on (the cursor in the address), the whole text is one click away, and
    the first page is one click back."""
    frames = "".join(f'  File "torch/testing/_internal/f{k}.py", line {k}\n' for k in range(400))
    run_id = _stored_push_run(
        served_run,
        "b" * 40,
        "a change that breaks everything",
        "completed",
        [
            TestResult(
                nodeid=f"test/test_big.py::TestBig::test_case_{i:04d}",
                outcome="failed",
                message=f"AssertionError: case {i}",
                details=f"Traceback (most recent call last):\n{frames}AssertionError: case {i}",
            )
            for i in range(1100)
        ],
    )

    page = watched.page
    page.goto(f"{served_run.url}/runs/{run_id}")
    expect(page.locator("h2#failures")).to_have_text("Failures (1100)")
    failures = page.locator("li.failure")
    expect(failures).to_have_count(50)
    expect(failures.first.locator("a.nodeid")).to_have_text(re.compile("test_case_0000$"))
    text = failures.first.locator("details.traceback pre")
    expect(text).to_be_hidden()  # folded: the page is a list of names and messages
    failures.first.locator("details.traceback summary").click()
    expect(text).to_contain_text("characters cut: the whole text is behind the link")
    shot(page, "08-large-run-first-page.png")
    page.locator("a.failures-next").click()
    expect(page).to_have_url(re.compile(rf"/runs/{run_id}\?failures_after=0-\d+#failures$"))
    expect(failures).to_have_count(50)
    expect(failures.first.locator("a.nodeid")).to_have_text(re.compile("test_case_0050$"))
    failures.first.locator("details.traceback summary").click()
    failures.first.locator("a", has_text="the whole text").click()
    expect(page.locator("body")).to_contain_text("f399.py")
    expect(page.locator("body")).to_contain_text("AssertionError: case 50")
    page.go_back()
    page.locator("a[rel=first]").click()
    expect(failures.first.locator("a.nodeid")).to_have_text(re.compile("test_case_0000$"))
    assert watched.dialogs == [] and watched.errors == []
