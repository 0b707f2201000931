"""Triage: the verdict on a run's failures, from real reruns on the sample upstream (at
head, at the base, on cpu, and a bisection of the PR's commits), carried by every report and
shown on the dashboard (in a real browser)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import expect, sync_playwright
from sqlalchemy import select

from ci_relay.context import RelayContext
from ci_relay.pipeline.triage import variant_on
from ci_relay.reporting.build import load_facts, render_callback, render_hud
from ci_relay.reporting.github import output
from ci_relay.reporting.wire import MAX_SEND_BYTES
from ci_relay.sample_upstream import SampleUpstream
from ci_relay.service.app import create_app
from ci_relay.settings import Settings
from ci_relay.steps import Next
from ci_relay.store.models import OutboxMessage, Run, Triage, TriageState
from ci_relay.triage.bisect import bisect, bisect_together
from ci_relay.triage.summary import finish
from ci_relay.triage.verdict import ChangeFacts, Observed, classify, run_verdict
from tests.gitrepo import GitRepo
from tests.relay_fixtures import drain, post_webhook, served_app, upstream_context
from tests.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS
from tests.test_selection_agents import FakeChat

HEAD = "h" * 40
BASE = "b" * 40
FACTS = ChangeFacts("spyre-emu", HEAD, BASE, 7, frozenset({"torch/_refs/__init__.py"}))


# --- the rules, one by one -------------------------------------------------------------------


def test_a_pass_on_rerun_is_a_flake() -> None:
    v = classify(Observed("t.py::C::test_x", "t.py::C::test_x", "failed", rerun="passed"), FACTS)
    assert (v.category, v.confidence, v.suspected_upstream) == ("flake", "medium", None)


def test_a_failure_at_the_base_too_is_the_backends() -> None:
    seen = Observed(
        "t.py::C::t", "t.py::C::t", "failed", rerun="failed", base="failed", cpu="passed"
    )
    v = classify(seen, FACTS)
    assert (v.category, v.confidence) == ("backend", "high")  # three checks agree
    seen.cpu = None  # cpu not run: two checks
    assert classify(seen, FACTS).confidence == "medium"


def test_a_pass_at_the_base_blames_the_change_and_says_where() -> None:
    seen = Observed(
        "t.py::C::t", "t.py::C::t", "failed", rerun="failed", base="passed", cpu="failed"
    )
    v = classify(seen, FACTS)
    assert (v.category, v.confidence, v.suspected_upstream) == (
        "upstream",
        "medium",
        "#7 (hhhhhhhhhhhh)",
    )
    assert "fails on cpu too: an upstream bug for every backend" in v.summary
    seen.first_bad, seen.cpu = "c" * 40, "passed"
    v = classify(seen, FACTS)
    assert (v.confidence, v.suspected_upstream) == ("high", "c" * 40)
    assert "specific to spyre-emu" in v.summary


@pytest.mark.parametrize(
    ("outcome", "message", "nodeid"),
    [
        ("crashed", "the test ran longer than its 600s timeout and was killed", "t.py::C::t"),
        ("crashed", "the test went over its memory limit and was killed", "t.py::C::t"),
        ("error", "ImportError: no module named widget", "test/test_other.py"),
    ],
)
def test_the_machine_not_the_test_is_infra(outcome: str, message: str, nodeid: str) -> None:
    v = classify(Observed(nodeid, nodeid, outcome, message), FACTS)
    assert v.category == "infra" and message in v.summary


def test_a_collection_error_in_a_file_the_change_touched_is_not_infra() -> None:
    facts = ChangeFacts("spyre-emu", HEAD, BASE, None, frozenset({"test/test_x.py"}))
    seen = Observed(
        "test/test_x.py", "test/test_x.py", "error", "SyntaxError", rerun="error", base="passed"
    )
    assert classify(seen, facts).category == "upstream"


@pytest.mark.parametrize(
    ("rerun", "base", "why"),
    [
        ("failed", "absent", "the base"),  # the test is not there at the base
        (None, None, "the rerun"),  # the rerun could not run at all
        ("skipped", None, "the rerun"),
    ],
)
def test_what_the_checks_cannot_settle_is_unknown(
    rerun: str | None, base: str | None, why: str
) -> None:
    v = classify(Observed("t.py::C::t", "t.py::C::t", "failed", rerun=rerun, base=base), FACTS)
    assert (v.category, v.confidence) == ("unknown", "low") and why in v.summary


def test_the_run_verdict_puts_a_broken_test_first_and_drops_confidence_on_disagreement() -> None:
    up = classify(
        Observed("a", "a", "failed", rerun="failed", base="passed", first_bad="c" * 40), FACTS
    )
    flake = classify(Observed("b", "b", "failed", rerun="passed"), FACTS)
    alone = run_verdict([up], [], 0)
    assert (alone["category"], alone["confidence"], alone["suspected_upstream"]) == (
        "upstream",
        up.confidence,
        "c" * 40,
    )
    mixed = run_verdict([up, up, flake], [], 3)
    assert (mixed["category"], mixed["confidence"]) == ("upstream", "low")
    assert "2 upstream, 1 flake" in mixed["summary"]
    flakes = run_verdict([flake, flake, up], [], 0)  # a broken test outweighs older noise
    assert (flakes["category"], flakes["suspected_upstream"]) == ("upstream", "c" * 40)
    assert run_verdict([flake, flake], [], 0)["category"] == "flake"
    assert "3 more failing test(s) were not triaged" in mixed["evidence"][-1]
    broken = run_verdict([], ["shard 0: runner image x is missing"], 0)
    assert (broken["category"], broken["confidence"]) == ("infra", "high")


def test_bisection_finds_the_first_bad_commit_in_few_steps() -> None:
    commits = [f"{i:040x}" for i in range(1, 17)]  # base 0, then 16 commits; 11 broke it
    asked: list[str] = []

    def probe(sha: str) -> Any:
        asked.append(sha)
        return "bad" if int(sha, 16) >= 11 else "good"

    found = bisect("0" * 40, commits, probe, max_steps=8)
    assert found.first_bad == f"{11:040x}" and len(asked) == 4  # log2(16)
    short = bisect("0" * 40, commits, probe, max_steps=2)
    assert short.first_bad is None and "stopped after 2 step(s)" in (short.note or "")
    stuck = bisect("0" * 40, commits, lambda sha: "skip", max_steps=8)
    assert stuck.first_bad is None and "could not run there" in (stuck.note or "")


def test_tests_bisected_together_share_the_probes_until_they_part() -> None:
    commits = [f"{i:040x}" for i in range(1, 17)]
    broke = {"a": 11, "b": 3, "c": 11}
    probes: list[tuple[str, list[str]]] = []

    def probe(sha: str, group: list[str]) -> dict[str, Any]:
        probes.append((sha, sorted(group)))
        return {t: "bad" if int(sha, 16) >= broke[t] else "good" for t in group}

    found = bisect_together("0" * 40, commits, ["a", "b", "c"], probe, max_steps=8)
    assert {t: int(f.first_bad or "0", 16) for t, f in found.items()} == broke
    assert len(probes) < 3 * 4  # a and c were never probed apart
    assert all(("a" in g) == ("c" in g) for _, g in probes)
    narrow = bisect_together("0" * 40, commits, ["a"], probe, max_steps=1)
    assert narrow["a"].first_bad is None and "stopped after 1 step(s)" in (narrow["a"].note or "")


def test_a_variant_is_named_for_another_backend() -> None:
    spyre = "test/test_x.py::TestFooSPYRE::test_add_spyre_float16"
    assert (
        variant_on(spyre, "spyre-emu", "cpu") == "test/test_x.py::TestFooCPU::test_add_cpu_float16"
    )
    assert variant_on("test/test_x.py::TestPlain::test_y", "spyre-emu", "cpu") == (
        "test/test_x.py::TestPlain::test_y"
    )


# --- end to end on the sample upstream -------------------------------------------------------

CASES = """
from pathlib import Path

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase, run_tests

COUNTER = Path({counter!r})


def scale(t):
    return t * 2


class TestTriage(TestCase):
    def test_scale(self, device):
        t = torch.ones(3, device=device)
        self.assertEqual(scale(t).cpu(), torch.full((3,), 2.0))

    def test_known_broken(self, device):  # the card has no matrix inverse (no-kernel family)
        halves = torch.linalg.inv(torch.eye(3, device=device) * 2).diagonal()
        self.assertEqual(halves.cpu(), torch.full((3,), 0.5))

    def test_sometimes(self, device):
        seen = int(COUNTER.read_text()) if COUNTER.exists() else 0
        COUNTER.write_text(str(seen + 1))
        self.assertGreater(seen, 1, "fails the first two times it runs")


instantiate_device_type_tests(TestTriage, globals())

if __name__ == "__main__":
    run_tests()
"""
SPEC = """\
test_suite_config:
  files:
    - path: ${TORCH_ROOT}/test/test_triage_cases.py
      unlisted_test_mode: mandatory_success
"""
SPYRE = "test/test_triage_cases.py::TestTriageSPYRE::"


@dataclass
class Triaged:
    rt: RelayContext
    client: TestClient
    run_id: int
    base: str
    breaking: str
    head: str


def _pull_request(number: int, base: str, head: str) -> dict[str, Any]:
    return {
        "action": "opened",
        "number": number,
        "pull_request": {
            "number": number,
            "head": {"sha": head, "ref": f"pr-{number}"},
            "base": {"sha": base, "ref": "main"},
            "labels": [],
        },
        "repository": {"full_name": "sample/pytorch"},
    }


@pytest.fixture(scope="module")
def triaged(
    sample_upstream: SampleUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Triaged]:
    tmp = tmp_path_factory.mktemp("triage")
    subprocess.run(
        ["git", "clone", "-q", str(sample_upstream.path), str(tmp / "upstream")], check=True
    )
    repo = GitRepo(tmp / "upstream")
    cases = CASES.format(counter=str(tmp / "sometimes.count"))
    base = repo.commit("triage cases", {"test/test_triage_cases.py": cases}, dedent=False)
    refs = (tmp / "upstream" / "torch" / "_refs" / "__init__.py").read_text()
    repo.commit("refs: a comment", {"torch/_refs/__init__.py": refs + "\n# one\n"}, dedent=False)
    breaking = repo.commit(
        "scale through an FFT round trip",  # no FFT kernels on the card: spyre-only failure
        {
            "test/test_triage_cases.py": cases.replace(
                "return t * 2", "return torch.fft.irfft(torch.fft.rfft(t), n=t.shape[0]) * 2"
            )
        },
        dedent=False,
    )
    head = repo.commit(
        "refs: another comment",
        {"torch/_refs/__init__.py": refs + "\n# one\n# two\n"},
        dedent=False,
    )
    # the test's own upstream: running it unisolated is a person's choice, as the settings say
    rt = upstream_context(
        tmp,
        repo.path,
        SPEC,
        backends=("spyre-emu",),
        runtime="local",
        crcr_callback_url="http://127.0.0.1:9/crcr",
        hud_url="http://127.0.0.1:9/hud",
        downstream_repo="acme/spyre-ci",
        public_url="http://relay.test",
    )
    steps: list[Next] = []
    with TestClient(create_app(rt, steps.extend)) as client:
        post_webhook(client, "pull_request", _pull_request(11, base, head))
        drain(rt, steps)
        with rt.db.session() as s:
            run_id = s.scalars(select(Run.id)).one()
        yield Triaged(rt, client, run_id, base, breaking, head)


def _verdicts(t: Triaged) -> tuple[Triage, dict[str, dict[str, Any]]]:
    with t.rt.db.session() as s:
        job = s.scalars(select(Triage).where(Triage.run_id == t.run_id)).one()
        s.expunge(job)
    return job, {v["test"].removeprefix(SPYRE): v for v in job.tests}


def test_each_failure_gets_the_verdict_its_reruns_show(triaged: Triaged) -> None:
    job, tests = _verdicts(triaged)
    assert job.state == TriageState.DONE, job.error
    assert set(tests) == {"test_scale_spyre", "test_known_broken_spyre", "test_sometimes_spyre"}
    scale = tests["test_scale_spyre"]
    assert scale["category"] == "upstream"
    assert scale["suspected_upstream"] == triaged.breaking  # bisected past the two comments
    assert scale["checks"] == {
        "rerun": "failed",
        "base": "passed",
        "cpu": "passed",
        "first_bad": triaged.breaking,
    }
    assert scale["confidence"] == "high" and "specific to spyre-emu" in scale["summary"]
    broken = tests["test_known_broken_spyre"]
    assert (broken["category"], broken["checks"]["base"], broken["checks"]["cpu"]) == (
        "backend",
        "failed",
        "passed",
    )
    flaky = tests["test_sometimes_spyre"]
    assert (flaky["category"], flaky["checks"]["rerun"], flaky["checks"]["base"]) == (
        "flake",
        "passed",
        None,  # settled by the rerun: no run at the base
    )
    assert job.device_seconds > 0
    assert job.verdict["category"] == "upstream" and job.verdict["confidence"] == "low"  # mixed


def test_the_verdict_rides_every_report_as_an_update(triaged: Triaged) -> None:
    with triaged.rt.db.session() as s:
        targets = [
            m.target
            for m in s.scalars(
                select(OutboxMessage)
                .where(OutboxMessage.run_id == triaged.run_id)
                .order_by(OutboxMessage.id)
            )
        ]
        facts = load_facts(s, triaged.run_id, with_failures=True)
    # in_progress, completed, then completed again with the verdict: per target
    assert targets.count("crcr") == 3 and targets.count("hud") == 3
    callback = json.loads(render_callback(facts, triaged.rt.settings, "completed", MAX_SEND_BYTES))
    verdict = callback["workflow"]["triage_verdict"]
    assert verdict["category"] == "upstream" and verdict["suspected_upstream"] == triaged.breaking
    assert verdict["analyzer"]["name"] == "ci-relay-triage"
    hud = json.loads(render_hud(facts, triaged.rt.settings, "completed", MAX_SEND_BYTES))
    assert hud["untrusted"]["callback_payload"]["workflow"]["triage_verdict"] == verdict
    summary = output(facts, triaged.rt.settings, "completed")["summary"]
    assert "### Triage: upstream (low confidence)" in summary
    assert triaged.breaking in summary
    in_progress = json.loads(
        render_callback(facts, triaged.rt.settings, "in_progress", MAX_SEND_BYTES)
    )
    assert in_progress["workflow"]["triage_verdict"] is None


def test_the_dashboard_json_twin_carries_each_verdict(triaged: Triaged) -> None:
    view = triaged.client.get(f"/api/runs/{triaged.run_id}/view").json()
    run = view["runs"][0] if "runs" in view else view["run"]
    assert run["triage_state"] == "done"
    assert {v["category"] for v in run["triage_tests"]} == {"upstream", "backend", "flake"}
    grid = triaged.client.get("/api/grid").json()
    assert json.dumps(grid).count('"triage": "upstream"') == 1


@pytest.fixture(scope="module")
def served(triaged: Triaged) -> Iterator[str]:
    with served_app(triaged.rt) as url:
        yield url


@pytest.mark.browser
def test_the_verdicts_in_a_browser(triaged: Triaged, served: str, tmp_path: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{served}/")
        badge = page.locator('td.cell[data-backend="spyre-emu"] .triage-badge')
        expect(badge).to_have_text("upstream")
        page.locator('td.cell[data-backend="spyre-emu"] a').first.click()
        expect(page.locator(f"#triage-{triaged.run_id}")).to_contain_text("upstream")
        rows = page.locator("table.triage-tests tbody tr")
        expect(rows).to_have_count(3)
        scale = page.locator('table.triage-tests tr[data-category="upstream"]')
        expect(scale).to_contain_text("test_scale_spyre")
        expect(scale).to_contain_text(triaged.breaking[:12])
        expect(page.locator('table.triage-tests tr[data-category="flake"]')).to_contain_text(
            "test_sometimes_spyre"
        )
        expect(page.locator('table.triage-tests tr[data-category="backend"]')).to_contain_text(
            "test_known_broken_spyre"
        )
        page.screenshot(path=str(tmp_path / "triage.png"))
        browser.close()


# --- the summary's writer, and a run that could not test ---------------------------------------

DRAFT = {
    "category": "backend",
    "confidence": "medium",
    "summary": "t fails at the base too.",
    "suspected_upstream": None,
    "evidence": ["backend (medium): t"],
}


@pytest.fixture
def chat() -> Iterator[FakeChat]:
    server = FakeChat()
    yield server
    server.close()


def test_an_llm_words_the_summary_but_cannot_change_the_category(
    chat: FakeChat, tmp_path: Path
) -> None:
    chat.answer = {
        "summary": "The failure predates the change: a backend gap.",
        "category": "flake",
    }
    settings = Settings(
        data_dir=tmp_path, triage_agent="llm", llm_url=chat.url, llm_model="m", llm_api_key="k"
    )
    verdict = finish(dict(DRAFT), settings)
    assert verdict.summary == "The failure predates the change: a backend gap."
    assert verdict.category == "backend" and verdict.analyzer.model == "m"
    assert "Category: backend" in chat.requests[0]["body"]["messages"][1]["content"]


@pytest.mark.parametrize("mode", ["garbage", "error"])
def test_an_llm_that_fails_leaves_the_template(chat: FakeChat, tmp_path: Path, mode: str) -> None:
    chat.mode = mode
    settings = Settings(data_dir=tmp_path, triage_agent="llm", llm_url=chat.url, llm_model="m")
    verdict = finish(dict(DRAFT), settings)
    assert verdict.summary == DRAFT["summary"] and verdict.analyzer.model is None
    assert "llm summary failed" in verdict.evidence[-1]


@pytest.mark.container
def test_a_missing_runner_image_is_infra(sample_upstream: SampleUpstream, tmp_path: Path) -> None:
    subprocess.run(
        ["git", "clone", "-q", str(sample_upstream.path), str(tmp_path / "upstream")], check=True
    )
    repo = GitRepo(tmp_path / "upstream")
    head = repo.git("rev-parse", "HEAD")
    spec = SPEC.replace("test_triage_cases.py", "test_view_ops.py")
    # the card's runner image needs a non-public base image: it is never built here
    rt = upstream_context(tmp_path, repo.path, spec, backends=("spyre",), runtime="container")
    steps: list[Next] = []
    with TestClient(create_app(rt, steps.extend)) as client:
        post_webhook(
            client, "pull_request", _pull_request(12, repo.git("rev-parse", "HEAD~1"), head)
        )
        drain(rt, steps)
        with rt.db.session() as s:
            run = s.scalars(select(Run)).one()
            job = s.scalars(select(Triage)).one()
            conclusion, verdict, tests = run.conclusion, job.verdict, job.tests
    assert conclusion == "error"
    assert (verdict["category"], verdict["confidence"]) == ("infra", "high")
    assert tests == []  # nothing to rerun: the run itself could not test
    assert "runner image localhost/ci-relay-runner-spyre:src-" in verdict["summary"]
    assert "is missing" in verdict["summary"]
    assert "ci-relay images build --backend spyre" in verdict["summary"]


SLOW_FAILURE = """
import time


def test_slow_and_wrong():
    time.sleep(20)
    assert 1 + 1 == 3
"""


@pytest.mark.container
def test_a_worker_stop_during_triage_is_no_verdict(
    sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    """The worker stops while triage reruns a failure in a container: the rerun's container
    goes, and the triage is left claimed for the next worker, not recorded as "triage
    failed" (which would send a verdict of unknown to every report)."""
    import threading

    import docker
    from ci_relay.execution.runtimes import PODMAN_SOCKET, WorkerStopping
    from ci_relay.execution.runtimes import container as containers
    from tests.test_container_cleanup import _owned_by

    subprocess.run(
        ["git", "clone", "-q", str(sample_upstream.path), str(tmp_path / "upstream")], check=True
    )
    repo = GitRepo(tmp_path / "upstream")
    base = repo.git("rev-parse", "HEAD")
    head = repo.commit("a slow failing test", {"test/test_slow.py": SLOW_FAILURE}, dedent=False)
    spec = SPEC.replace("test_triage_cases.py", "test_slow.py")
    rt = upstream_context(tmp_path, repo.path, spec, backends=("cpu",), runtime="container")
    engine = docker.DockerClient(base_url=PODMAN_SOCKET, timeout=60)
    done = threading.Event()

    def stop_once_triage_runs_a_container() -> None:
        import time

        while not done.is_set():
            with rt.db.session() as s:
                triaging = s.scalars(select(Triage.state)).first() == TriageState.RUNNING
            if triaging and _owned_by(engine, os.getpid()):
                containers.stop_shard_containers()
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=stop_once_triage_runs_a_container, daemon=True)
    steps: list[Next] = []
    try:
        with TestClient(create_app(rt, steps.extend)) as client:
            post_webhook(client, "pull_request", _pull_request(13, base, head))
            watcher.start()
            with pytest.raises(WorkerStopping):
                drain(rt, steps)
        with rt.db.session() as s:
            run = s.scalars(select(Run)).one()
            job = s.scalars(select(Triage)).one()
            assert run.conclusion == "failure"  # the run itself had its verdict
            assert (job.state, job.verdict, job.error) == (TriageState.RUNNING, {}, None)
        assert _owned_by(engine, os.getpid()) == []
    finally:
        done.set()
        watcher.join(timeout=30)
        containers._live.stopping.clear()  # this process goes on running other tests
        engine.close()
