"""Stage 3 agents and the selector end to end (real git, real model, real HTTP on loopback)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ci_relay.sample_upstream import SampleUpstream
from test_selection.agents import LLMAgent, LocalAgent, NoAgent
from test_selection.change_analysis import analyze
from test_selection.git import Repo
from test_selection.inventory import build_inventory
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget, Evidence, Scored, TestId
from tests.conftest import BUNDLED_SPECS, CliResult


class FakeChat:
    """An OpenAI-compatible ``/v1/chat/completions`` on loopback, scripted per test."""

    def __init__(self) -> None:
        self.mode = "good"
        self.requests: list[dict[str, Any]] = []
        self.answer: dict[str, Any] = {"tests": []}
        chat = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                chat.requests.append(
                    {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
                )
                if chat.mode == "slow":
                    time.sleep(1.5)
                if chat.mode == "error":
                    self.send_response(500)
                    self.end_headers()
                    return
                content = "this is not json" if chat.mode == "garbage" else json.dumps(chat.answer)
                payload = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": content},
                        }
                    ],
                }
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def chat() -> Iterator[FakeChat]:
    server = FakeChat()
    yield server
    server.close()


def _review_setup(sample: SampleUpstream, tmp_path: Path) -> tuple[Any, dict[TestId, Scored], Any]:
    repo = Repo(sample.path)
    change = analyze(repo, sample.commits[4].sha, sample.commits[5].sha)  # the gelu change
    inv = build_inventory(repo, sample.commits[5].sha, cache_dir=tmp_path / "c")
    scored = {t.id: Scored(t.id) for t in inv.tests()}
    added = TestId("test/test_nn_functional.py", "TestNNFunctional", "test_gelu_tanh_approximation")
    scored[added].evidence.append(
        Evidence("candidates", "edited-by-change", 1.0, "the change adds this test")
    )
    return change, scored, inv


@pytest.mark.slow
def test_local_agent_ranks_related_tests_higher(
    sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    change, scored, inv = _review_setup(sample_upstream, tmp_path)
    review = LocalAgent(tmp_path / "c").review(change, scored, inv)
    assert review.agent == "local"
    sims = {t: next(e.score for e in s.evidence if e.source == "local") for t, s in scored.items()}
    gelu = sims[
        TestId("test/test_nn_functional.py", "TestNNFunctional", "test_gelu_matches_erf_formula")
    ]
    view = sims[TestId("test/test_view_ops.py", "TestViewOps", "test_view_shares_storage")]
    assert gelu > view
    assert list((tmp_path / "c" / "embeddings").glob("*.npz"))  # kept on disk


@pytest.mark.slow
def test_local_agent_embeds_a_test_once_across_revisions(
    sample_upstream: SampleUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model stays loaded and an unchanged test is never embedded again, even at another
    revision (the cache is keyed by the text, not by the tree)."""
    from test_selection import agents

    model = agents._embedding_model()
    embedded: list[int] = []
    original = model.encode

    def counting(texts: list[str], **kwargs: Any) -> Any:
        embedded.append(len(texts))
        return original(texts, **kwargs)

    monkeypatch.setattr(model, "encode", counting)
    repo = Repo(sample_upstream.path)
    for older, newer in ((3, 4), (4, 5)):
        change = analyze(
            repo, sample_upstream.commits[older].sha, sample_upstream.commits[newer].sha
        )
        inv = build_inventory(repo, sample_upstream.commits[newer].sha, cache_dir=tmp_path / "c")
        scored = {t.id: Scored(t.id) for t in inv.tests()}
        LocalAgent(tmp_path / "c").review(change, scored, inv)
    assert agents._embedding_model() is model  # loaded once for the process
    assert len(embedded) == 4  # [tests, hunks] per review: the second had tests to embed
    assert 0 < embedded[2] < embedded[0]  # only the tests the newer commit changed or added
    agents._STORES.clear()  # a new process reads the store from disk: no test to embed
    scored = {t.id: Scored(t.id) for t in inv.tests()}
    LocalAgent(tmp_path / "c").review(change, scored, inv)
    assert len(embedded) == 5 and embedded[4] == embedded[3]  # the change's hunks only


def test_llm_agent_speaks_openai_json_and_is_bounded(
    chat: FakeChat, sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    change, scored, inv = _review_setup(sample_upstream, tmp_path)
    added = "test/test_nn_functional.py::TestNNFunctional::test_gelu_tanh_approximation"
    erf = "test/test_nn_functional.py::TestNNFunctional::test_gelu_matches_erf_formula"
    chat.answer = {
        "tests": [
            {"test": added, "relevance": 0.0, "reason": "looks unrelated"},
            {"test": erf, "relevance": 1.0, "reason": "exercises gelu"},
            {
                "test": "test/test_nowhere.py::T::test_invented",
                "relevance": 1.0,
                "reason": "made up",
            },
        ]
    }
    agent = LLMAgent(chat.url, "test-model", api_key="k", fallback=NoAgent(), top=50, retries=0)
    review = agent.review(change, scored, inv)
    assert review.agent == "llm" and "llm ranked 2 of" in review.notes[-1]
    request = chat.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer k"
    assert request["body"]["response_format"] == {"type": "json_object"}
    llm = {t.nodeid: e for t, s in scored.items() for e in s.evidence if e.source == "llm"}
    assert llm[erf].score > 0 and llm[erf].reason == "exercises gelu"
    assert llm[added].score == 0.0  # it may not push out a test the change adds


@pytest.mark.parametrize("mode", ["garbage", "slow", "error"])
def test_llm_failures_fall_back_to_the_local_ranking(
    mode: str, chat: FakeChat, sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    chat.mode = mode
    change, scored, inv = _review_setup(sample_upstream, tmp_path)
    agent = LLMAgent(chat.url, "m", fallback=NoAgent(), timeout=0.5, retries=1)
    review = agent.review(change, scored, inv)
    assert review.agent == "none"
    assert (
        "llm agent failed" in review.notes[-1]
        and "used the none agent's ranking" in review.notes[-1]
    )
    assert len(chat.requests) == 2  # one retry
    assert not any(e.source == "llm" for s in scored.values() for e in s.evidence)


def test_selector_plan_on_the_sample_upstream(
    sample_upstream: SampleUpstream, tmp_path: Path
) -> None:
    config = SelectorConfig(budget=Budget.parse("15%"), cache_dir=tmp_path / "c", shards=2)
    specs = sorted(BUNDLED_SPECS.glob("*.yaml"))
    plan, _ = select(sample_upstream.path, "HEAD~2", "HEAD~1", specs, config)
    data = plan.to_json()
    selected = {item["test"] for item in data["selected"]}
    assert {
        "test/test_binary_ufuncs.py::TestBinaryUfuncs::test_prod_reference",
        "test/test_binary_ufuncs.py::TestBinaryUfuncs::test_floor_divide_rounds_toward_zero",
    } <= selected
    assert data["universe_size"] == len(data["selected"]) + len(data["excluded"])
    for item in data["selected"] + data["excluded"]:
        assert set(item) >= {"test", "file", "score", "reasons"}
        assert item["test"].startswith(item["file"] + "::")
    # skip-mode tests are outside the universe
    assert not any(
        "test_div_rounding_modes" in item["test"] for item in data["selected"] + data["excluded"]
    )
    assert sorted(n for shard in data["shards"] for n in shard) == sorted(selected)
    assert data["change"]["ops"] == ["floor_divide", "prod"]


def test_select_cli_json_explain_and_bad_sha(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream
) -> None:
    result = cli(
        "select",
        "--upstream",
        sample_upstream.path,
        "--base",
        "HEAD~1",
        "--head",
        "HEAD",
        "--agent",
        "none",
        "--json",
    )
    assert result.code == 0, result.output
    data = json.loads(result.stdout)
    assert (
        data["selected"][0]["test"]
        == "test/test_nn_functional.py::TestNNFunctional::test_gelu_tanh_approximation"
    )
    explained = cli(
        "select",
        "--upstream",
        sample_upstream.path,
        "--base",
        "HEAD~1",
        "--head",
        "HEAD",
        "--agent",
        "none",
        "--explain",
        "test_gelu_tanh_approximation",
    )
    assert (
        explained.code == 0
        and "edited-by-change" in explained.stdout
        and "selected" in explained.stdout
    )
    bad = cli(
        "select",
        "--upstream",
        sample_upstream.path,
        "--base",
        "nope",
        "--head",
        "HEAD",
        "--agent",
        "none",
    )
    assert bad.code == 2 and "unknown revision 'nope'" in bad.stderr
    for option, value, said in (
        ("--budget", "lots", "bad budget"),
        ("--ranking", "best", "unknown ranking 'best'"),
        ("--ranking", "hand", "the hand weights were retired"),
        ("--trial", "learned/fastest", "unknown candidate(s) learned/fastest"),
        ("--trial", "history/whole", "history/whole is the baseline every candidate is judged by"),
    ):
        refused = cli(
            "select",
            "--upstream",
            sample_upstream.path,
            "--base",
            "HEAD~1",
            "--head",
            "HEAD",
            option,
            value,
        )
        assert refused.code == 2 and said in refused.output, (option, refused.output)


def test_select_eval_reports_recall_and_baselines(
    cli: Callable[..., CliResult], sample_upstream: SampleUpstream
) -> None:
    result = cli(
        "select-eval",
        "--upstream",
        sample_upstream.path,
        "--commits",
        "HEAD",
        "--agent",
        "none",
        "--json",
    )
    assert result.code == 0, result.output
    data = json.loads(result.stdout)
    assert data["commits_seen"] == 6 and data["commits_evaluated"] == 3
    assert set(data["strategies"]) == {"selector", "random", "path-only", "co-change-only"}
    selector = data["strategies"]["selector"]
    assert selector["test_file_recall"] == 1.0 and 0 < selector["selection_fraction"] < 0.5
    # the baselines run as many tests as the selector did, each commit
    fractions = {s["selection_fraction"] for s in data["strategies"].values()}
    assert fractions == {selector["selection_fraction"]}
