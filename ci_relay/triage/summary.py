"""The verdict's one paragraph: a template from the evidence, or an LLM's wording of it.

The model is shown the category, the confidence and the evidence and asked for a summary
only; whatever it answers, the category stays the checks' (it cannot change it). A model that
fails or answers garbage leaves the template, and the evidence says so.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

import ci_relay
from ci_relay.reporting.caps import triage_verdict
from ci_relay.reporting.wire import MAX_SUMMARY_BYTES, TriageVerdict
from ci_relay.settings import Settings
from test_selection.chat_client import ChatFailed, ask_json

ANALYZER = "ci-relay-triage"
PROMPT_VERSION = "1"
SYSTEM = (
    "You write the one-paragraph summary of a CI failure triage for PyTorch contributors. "
    "The category was decided by reruns; do not dispute it. Use only the evidence given. "
    'Answer with JSON only: {"summary": <at most 600 characters>}.'
)


class _Answer(BaseModel):
    summary: str = Field(min_length=20, max_length=MAX_SUMMARY_BYTES)


def _prompt(verdict: dict[str, Any]) -> str:
    lines = "\n".join(f"- {e}" for e in verdict["evidence"])
    suspect = verdict.get("suspected_upstream") or "none"
    return (
        f"Category: {verdict['category']} (confidence {verdict['confidence']})\n"
        f"Suspected upstream commit: {suspect}\nEvidence:\n{lines}\n"
        f"Draft summary: {verdict['summary']}"
    )


def finish(verdict: dict[str, Any], settings: Settings) -> TriageVerdict:
    """The run's verdict in the callback's format, its summary written by the configured
    agent (``triage_agent``); the category and evidence are never the model's."""
    evidence = list(verdict["evidence"])
    summary = str(verdict["summary"])
    model: str | None = None
    if settings.triage_agent == "llm":
        if not settings.llm_url or not settings.llm_model:
            evidence.append("llm summary not used: CI_RELAY_LLM_URL and CI_RELAY_LLM_MODEL unset")
        else:
            key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
            try:
                answer = ask_json(
                    settings.llm_url, settings.llm_model, key, SYSTEM, _prompt(verdict), _Answer
                )
                summary, model = answer.summary.strip(), settings.llm_model
            except ChatFailed as exc:
                evidence.append(f"llm summary failed ({exc}); the template summary is used")
    analyzer: dict[str, str | None] = {
        "name": ANALYZER,
        "version": ci_relay.__version__,
        "model": model,
        "prompt_version": PROMPT_VERSION if model else None,
    }
    return triage_verdict(
        str(verdict["category"]),
        str(verdict["confidence"]),
        summary,
        evidence,
        analyzer,
        suspected_upstream=verdict.get("suspected_upstream"),
    )
