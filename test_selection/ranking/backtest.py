"""The backtest a live change asks for: the cached choice at its anchor, made when missing.

The selector hands over what it was asked (``BacktestAsk``) and the ranking inputs; this
finds the change's anchor, reads the choice cached for it (or replays the candidates and
stores theirs, ``choice.py``), and adds the local agent's verdict, measured at anchors of
its own (``agent_check.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from test_selection.agents import Agent, LocalAgent
from test_selection.git import Repo
from test_selection.ranking.agent_check import AGENT_REMEASURE, AgentVerdict, measure_agent
from test_selection.ranking.cache import ChoiceCache
from test_selection.ranking.candidate import KEYS, on_trial
from test_selection.ranking.choice import MIN_CASES, RankingChoice, anchor_index, choose
from test_selection.ranking.history import History
from test_selection.ranking.inputs import RankingInputs


@dataclass(frozen=True)
class BacktestAsk:
    """What a selection asks of the backtest: which ranking (``auto``, a ranker, or one
    candidate's key), which candidates are on trial, the settings that make a cached choice
    another one's (test patterns, label, specs), where the cache is, the file weight, and
    the agent to measure."""

    ranking: str
    trial: tuple[str, ...]
    setting: Sequence[str]
    cache_dir: Path
    file_weight: float
    agent: Agent


def backtest_choice(
    repo: Repo,
    history: History,
    base: str,
    inputs: RankingInputs,
    fraction: float,
    ask: BacktestAsk,
) -> tuple[RankingChoice, list[str]]:
    """The backtest's choice for the anchor of a change at ``base``, from the cache when it
    was made (with the local agent's verdict, measured at its own anchors); and the notes the
    plan shows about the history it read."""
    notes: list[str] = []
    anchor = anchor_index(repo, history, base)
    if history.truncated:
        notes.append(
            f"history: the newest {len(history.shas)} commits were read (the repository has more)"
        )
    if repo.text("rev-parse", "--is-shallow-repository").strip() == "true":
        notes.append(
            f"the clone is shallow: {len(history.shas)} commit(s) of history before the change "
            "(git fetch --unshallow gives the backtest more)"
        )
    roots = repo.text("rev-list", "--max-parents=0", "--end-of-options", base).split()
    key = "|".join(
        [
            ",".join(sorted(roots)),
            *ask.setting,
            ask.ranking,
            *(f"trial:{key}" for key in sorted(ask.trial)),
            # with a map: measured with the map of the day the anchor was first replayed, and
            # kept while the anchor stands (a nightly map would otherwise replay every day)
            *(
                [f"coverage:{m.repository}:{m.backend}"]
                if (m := inputs.coverage.map if inputs.coverage else None)
                else []
            ),
        ]
    )
    cache = ChoiceCache(ask.cache_dir, key)
    fraction = round(fraction, 4)
    anchor_sha = history.shas[anchor] if anchor >= 0 else ""
    choice, warning = cache.load(anchor_sha, fraction, ask.file_weight)
    if warning:
        notes.append(warning)
    backtested_now = choice is None
    if choice is None:
        only = None if ask.ranking == "auto" else ask.ranking
        registry = on_trial(ask.trial)
        if only in KEYS:  # one candidate by name: measured alone, and used
            registry = tuple(c for c in registry if c.key == only)
            only = registry[0].ranker
        choice = choose(repo, history, anchor, inputs, fraction, ask.file_weight, only, registry)
        cache.store(choice, ask.file_weight)
    agent = ask.agent
    if isinstance(agent, LocalAgent) and choice.cases >= MIN_CASES and agent.available():
        at = anchor_index(repo, history, base, AGENT_REMEASURE)
        verdict, warning = cache.load_agent(agent.name, history.shas[at] if at >= 0 else "")
        if warning:
            notes.append(warning)
        if verdict is None and backtested_now:
            verdict = AgentVerdict(agent.name, False, 0.0, 0.0, 0, 0, 0.0, deferred=True)
        elif verdict is None:
            verdict = measure_agent(repo, history, at, set(inputs.sizes), inputs.is_test, agent)
            if not verdict.pending:
                cache.store_agent(history.shas[at] if at >= 0 else "", verdict)
        choice.agent = verdict
    return choice, notes
