"""Spec edits proposed from stored results: tests broken on every run, tests that flake.

A test that failed on every run of a backend for days is not news any more: the spec should
say ``xfail`` (with the error) so that a red cell means a new failure. A test that passes only
on its rerun often enough should carry a tag (or be skipped, by policy) so nobody chases it.
These are proposals: ``ci-relay specs suggest`` prints them as a patch and the test page shows
them; nothing edits a spec by itself.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from ci_relay.execution.outcomes import BAD_OUTCOMES
from ci_relay.store.models import Change, Run, RunState, Selection, Shard, TestResult
from reuse_specs.loader import FileRules, LoadedSpec
from reuse_specs.matching import TestVariant, find_rule
from reuse_specs.spec_patch import SpecEdit
from test_selection.variants import match_variants

Action = Literal["xfail", "tag", "skip"]
QUIET_MODES = frozenset({"xfail", "xfail_strict", "skip"})  # a failure there is expected


@dataclass(frozen=True)
class SuggestPolicy:
    since: datetime
    min_runs: int = 3  # fewer runs prove nothing
    flake_rate: float = 0.2  # of a test's results, the share that passed only on rerun
    flake_action: Literal["tag", "skip"] = "tag"
    flake_tag: str = "flaky"


@dataclass(frozen=True)
class Suggestion:
    test: str  # generic FILE::Class::name, as a spec names it
    action: Action
    reason: str  # one line, written as the spec line's comment
    runs: int


@dataclass
class _Seen:
    runs: set[int] = field(default_factory=set)
    failing_runs: set[int] = field(default_factory=set)
    results: int = 0
    flaky: int = 0
    quiet: bool = False  # the spec already expects it to fail or skips it
    last_error: str = ""


def suggest(
    session: Session, backend: str, policy: SuggestPolicy, repository: str | None = None
) -> list[Suggestion]:
    """What the stored results of ``backend``'s finished runs since ``policy.since`` say."""
    runs = (
        select(Run.id)
        .join(Change)
        .where(
            Run.backend == backend, Run.state == RunState.COMPLETED, Run.created_at >= policy.since
        )
    )
    if repository is not None:
        runs = runs.where(Change.repository == repository)
    run_ids = list(session.scalars(runs))
    if not run_ids:
        return []
    generic: set[str] = set()
    for plan in session.scalars(select(Selection.plan).where(Selection.run_id.in_(run_ids))):
        if isinstance(plan, dict):
            generic |= {str(t.get("test")) for t in plan.get("selected", []) if isinstance(t, dict)}
    rows = session.execute(
        select(
            Shard.run_id, TestResult.nodeid, TestResult.outcome, TestResult.mode, TestResult.message
        )
        .join(Shard, TestResult.shard_id == Shard.id)
        .where(Shard.run_id.in_(run_ids))
        .order_by(Shard.run_id, TestResult.id)
    ).all()
    owner = {
        v: g
        for g, variants in match_variants(generic, {r.nodeid for r in rows}).items()
        for v in variants
    }
    seen: dict[str, _Seen] = defaultdict(_Seen)
    for row in rows:
        test = owner.get(row.nodeid, row.nodeid)
        _add(seen[test], row.run_id, row.outcome, row.mode, row.message)
    return [s for test, item in sorted(seen.items()) if (s := _judge(test, item, policy))]


def suggest_for_variant(
    session: Session, nodeid: str, policy: SuggestPolicy
) -> list[tuple[str, Suggestion]]:
    """The test page's proposals: one executed variant's results per backend."""
    rows = session.execute(
        select(Run.backend, Shard.run_id, TestResult.outcome, TestResult.mode, TestResult.message)
        .join(Shard, TestResult.shard_id == Shard.id)
        .join(Run, Shard.run_id == Run.id)
        .where(TestResult.nodeid == nodeid, Run.created_at >= policy.since)
        .order_by(Shard.run_id, TestResult.id)
    ).all()
    per_backend: dict[str, _Seen] = defaultdict(_Seen)
    for row in rows:
        _add(per_backend[row.backend], row.run_id, row.outcome, row.mode, row.message)
    return [
        (backend, found)
        for backend, item in sorted(per_backend.items())
        if (found := _judge(nodeid, item, policy))
    ]


def _add(item: _Seen, run_id: int, outcome: str, mode: str | None, message: str | None) -> None:
    if outcome == "skipped":
        return
    item.runs.add(run_id)
    item.results += 1
    item.quiet |= (mode or "") in QUIET_MODES
    if outcome == "flaky":
        item.flaky += 1
    elif outcome in BAD_OUTCOMES:
        item.failing_runs.add(run_id)
        item.last_error = (message or outcome).strip()


def _judge(test: str, item: _Seen, policy: SuggestPolicy) -> Suggestion | None:
    if item.quiet or len(item.runs) < policy.min_runs:
        return None
    since = policy.since.date().isoformat()
    if item.failing_runs == item.runs:
        reason = f"failed in all {len(item.runs)} runs since {since}: {item.last_error}"
        return Suggestion(test, "xfail", reason, len(item.runs))
    rate = item.flaky / item.results if item.results else 0.0
    if rate >= policy.flake_rate:
        reason = (
            f"passed only on rerun in {item.flaky} of {item.results} results since {since} "
            f"({rate:.0%})"
        )
        return Suggestion(test, policy.flake_action, reason, len(item.runs))
    return None


def edits_for(
    suggestions: list[Suggestion], spec: LoadedSpec, policy: SuggestPolicy
) -> tuple[list[SpecEdit], list[str]]:
    """The spec edits that carry out the suggestions, and those no spec entry covers."""
    edits: list[SpecEdit] = []
    uncovered: list[str] = []
    for suggestion in suggestions:
        file, _, name = suggestion.test.partition("::")
        entry = next((e for e in spec.files if _covers(e, file)), None)
        if entry is None:
            uncovered.append(f"{suggestion.test}: no spec entry covers {file}")
            continue
        cls, _, method = name.rpartition("::")
        found = find_rule(entry, TestVariant(Path(file), cls or None, method))
        current = found[0].entry.mode if found else entry.unlisted_test_mode
        exact = found if found is not None and not found[1].is_glob else None
        if suggestion.action == "tag":
            if exact:
                uncovered.append(f"{suggestion.test}: listed already; add the tag by hand")
                continue
            edits.append(
                SpecEdit(
                    "add_test",
                    entry.raw_path,
                    name,
                    str(current),
                    suggestion.reason,
                    entry.source,
                    (policy.flake_tag,),
                )
            )
            continue
        mode = "xfail" if suggestion.action == "xfail" else "skip"
        if exact and len(exact[0].names) == 1:
            listed = exact[1].text
            edits.append(
                SpecEdit("set_mode", entry.raw_path, listed, mode, suggestion.reason, entry.source)
            )
            continue
        if exact:
            edits.append(
                SpecEdit(
                    "remove_test",
                    entry.raw_path,
                    exact[1].text,
                    None,
                    "moved to its own entry",
                    entry.source,
                )
            )
        edits.append(
            SpecEdit("add_test", entry.raw_path, name, mode, suggestion.reason, entry.source)
        )
    return edits, uncovered


def _covers(entry: FileRules, file: str) -> bool:
    raw = entry.raw_path
    for prefix in ("${TORCH_ROOT}/", "$TORCH_ROOT/"):
        if raw.startswith(prefix):
            raw = raw[len(prefix) :]
    return fnmatchcase(file, raw)
