"""One call to an OpenAI-compatible chat endpoint that must answer with a JSON object.

The selector's LLM agent and the relay's triage summaries ask through it, so both speak the
same protocol (``POST {url}/chat/completions``, ``response_format: json_object``), retry the
same failures and never print the key.
"""

from __future__ import annotations

import json
import logging
from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

log = logging.getLogger("test_selection.chat_client")

# what a failed call looks like: the network, an HTTP error, or an answer that is not the JSON
# asked for; each is retried, then the caller falls back to what it does without a model
ANSWER_FAILURES = (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError, ValidationError)
Answer = TypeVar("Answer", bound=BaseModel)


class ChatFailed(RuntimeError):
    """The endpoint gave no valid answer after the retries (the reason, never the key)."""


def ask_json(
    url: str,
    model: str,
    api_key: str | None,
    system: str,
    prompt: str,
    answer: type[Answer],
    *,
    timeout: float = 30.0,
    retries: int = 2,
) -> Answer:
    """The model's answer to ``prompt``, validated as ``answer``; :class:`ChatFailed` else."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {
        "model": model,
        "temperature": 0,
        "response_format": {"type": "json_object"},
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": prompt},
        ],
    }
    attempts = Retrying(
        retry=retry_if_exception_type(ANSWER_FAILURES),
        stop=stop_after_attempt(retries + 1),
        wait=wait_exponential(multiplier=0.2, max=2.0),
        before_sleep=lambda state: log.warning(
            "chat attempt %d failed: %s",
            state.attempt_number,
            state.outcome.exception() if state.outcome else "?",
        ),
        reraise=True,
    )
    try:
        for attempt in attempts:
            with attempt:
                response = httpx.post(
                    f"{url.rstrip('/')}/chat/completions",
                    json=body,
                    headers=headers,
                    timeout=timeout,
                )
                response.raise_for_status()
                content = response.json()["choices"][0]["message"]["content"]
                return answer.model_validate(json.loads(content))
    except ANSWER_FAILURES as exc:
        raise ChatFailed(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    raise AssertionError("unreachable")  # the loop returns or raises
