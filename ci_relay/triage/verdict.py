"""From what the checks saw to a verdict: pure, so every rule has a test of its own.

A failing test is looked at where the run cannot: once more at the head on the same backend
(a pass: ``flake``), at the change's base (fails there too: ``backend``; passes: ``upstream``,
the change broke it), at the head on cpu (fails there too: an upstream bug for every backend).
A run that did not get as far as a result (a timeout, an OOM, a missing image, a collection
error in a file the change did not touch) is ``infra``. Anything the checks cannot settle is
``unknown`` with the reason. Confidence is how many checks agree with the category.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ci_relay.execution.outcomes import BAD_OUTCOMES

GOOD = frozenset({"passed", "xfailed", "xpassed", "flaky"})
CATEGORIES = ("upstream", "backend", "infra", "flake", "unknown")
ABSENT = "absent"  # the check ran but the test was not there (removed, renamed, not built)
# a crash whose reason says the machine, not the test, ended it (see execution.crashes.why_it_died)
INFRA_CRASH_WORDS = ("timeout", "wall-clock", "memory", "quota", "SIGKILL", "before it ran")


@dataclass(frozen=True)
class ChangeFacts:
    """The change a run tested, as the verdict names it."""

    backend: str
    head: str
    base: str | None
    number: int | None = None
    files: frozenset[str] = frozenset()  # paths the change touched (base..head)

    @property
    def suspect(self) -> str:
        return f"#{self.number} ({self.head[:12]})" if self.number else self.head


@dataclass
class Observed:
    """One failing test and what each check saw (an outcome, ``absent``, or None: not run)."""

    nodeid: str
    generic: str
    outcome: str  # in the run
    message: str | None = None
    rerun: str | None = None  # at head, same backend
    base: str | None = None  # at the change's base, same backend
    cpu: str | None = None  # at head on cpu
    first_bad: str | None = None  # what a bisection of a longer range found
    bisect_note: str | None = None
    notes: list[str] = field(default_factory=list)  # why a check did not run, what it said


@dataclass(frozen=True)
class TestVerdict:
    __test__ = False

    test: str
    category: str
    confidence: str
    summary: str
    suspected_upstream: str | None
    evidence: list[str]
    checks: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _confidence(agreeing: int) -> str:
    return "high" if agreeing >= 3 else "medium" if agreeing == 2 else "low"


def infra_signal(outcome: str, message: str | None, nodeid: str, changed: frozenset[str]) -> str:
    """Why the run's result itself points at the machine ('' when it does not)."""
    text = message or ""
    if outcome == "crashed" and any(word in text for word in INFRA_CRASH_WORDS):
        return f"crashed: {text}"
    if outcome == "error" and "::" not in nodeid and nodeid not in changed:
        return f"collection error in {nodeid}, a file the change did not touch: {text}"
    return ""


def _seen(label: str, value: str | None) -> str:
    return f"{label}: {value if value is not None else 'not run'}"


def classify(obs: Observed, change: ChangeFacts) -> TestVerdict:
    """The verdict on one failing test from what the checks saw."""
    evidence = [f"in the run: {obs.outcome}" + (f" ({obs.message})" if obs.message else "")]
    checks = {"rerun": obs.rerun, "base": obs.base, "cpu": obs.cpu, "first_bad": obs.first_bad}
    evidence += [
        _seen(f"rerun at head on {change.backend}", obs.rerun),
        _seen(
            f"at base {change.base[:12] if change.base else '(none)'} on {change.backend}", obs.base
        ),
    ]
    if change.backend != "cpu":
        evidence.append(_seen("at head on cpu", obs.cpu))
    if obs.first_bad or obs.bisect_note:
        evidence.append(
            f"bisection: first bad {obs.first_bad}"
            if obs.first_bad
            else f"bisection: {obs.bisect_note}"
        )
    evidence += obs.notes
    suspect: str | None = None
    signal = infra_signal(obs.outcome, obs.message, obs.nodeid, change.files)
    if signal or (
        obs.rerun == "crashed" and any(w in " ".join(obs.notes) for w in INFRA_CRASH_WORDS)
    ):
        category, agreeing = "infra", 3 if signal.startswith("crashed") else 2
        why = signal or "its rerun was stopped by the machine (a timeout or a limit)"
        text = f"{obs.nodeid} did not run to a result on {change.backend}: {why}."
    elif obs.rerun in GOOD:
        category, agreeing = "flake", 2
        text = (
            f"{obs.nodeid} {obs.outcome} in the run and passed when rerun at the same commit "
            f"on {change.backend}: flaky, not caused by the change."
        )
    elif obs.rerun in BAD_OUTCOMES and obs.base in BAD_OUTCOMES:
        category = "backend"
        agreeing = 2 + (obs.cpu in GOOD)
        text = (
            f"{obs.nodeid} fails on {change.backend} at the change's base too: the failure "
            "predates the change"
            + (" and the test passes on cpu, so it is the backend's." if obs.cpu in GOOD else ".")
        )
    elif obs.rerun in BAD_OUTCOMES and obs.base in GOOD:
        category = "upstream"
        agreeing = 2 + (obs.first_bad is not None)
        suspect = obs.first_bad or change.suspect
        text = (
            f"{obs.nodeid} passes at the base and fails at the head on {change.backend}: "
            f"the upstream change {suspect} broke it."
        )
        if obs.cpu in BAD_OUTCOMES:
            text += " It fails on cpu too: an upstream bug for every backend."
        elif obs.cpu in GOOD:
            text += f" It passes on cpu: the break is specific to {change.backend}."
    else:
        category, agreeing = "unknown", 0
        missing = [
            name
            for name, seen in (("the rerun", obs.rerun), ("the base", obs.base))
            if seen is None or seen == ABSENT or (seen not in GOOD and seen not in BAD_OUTCOMES)
        ]
        text = (
            f"{obs.nodeid}: the checks could not settle it ({', '.join(missing) or 'no check'} "
            + ("gave no pass or fail).")
        )
    return TestVerdict(
        test=obs.nodeid,
        category=category,
        confidence=_confidence(agreeing),
        summary=text,
        suspected_upstream=suspect,
        evidence=evidence,
        checks=checks,
    )


def run_verdict(
    verdicts: list[TestVerdict], infra_errors: list[str], untriaged: int
) -> dict[str, Any]:
    """One verdict for the run: ``upstream`` when the change broke any triaged test, else the
    category most of them got (infra when the run could not test at all); its confidence is
    low when they disagree."""
    evidence = [f"{e}" for e in infra_errors]
    evidence += [f"{v.category} ({v.confidence}): {v.test}" for v in verdicts]
    if untriaged:
        evidence.append(f"{untriaged} more failing test(s) were not triaged (the per-run bound)")
    if not verdicts:
        if infra_errors:
            return {
                "category": "infra",
                "confidence": "high",
                "summary": "The run could not test: " + "; ".join(infra_errors),
                "suspected_upstream": None,
                "evidence": evidence,
            }
        return {
            "category": "unknown",
            "confidence": "low",
            "summary": "No failing test could be triaged.",
            "suspected_upstream": None,
            "evidence": evidence,
        }
    counted = Counter(v.category for v in verdicts)
    # a change that broke a test is what its author must hear, however many failures predate
    # it; otherwise the category most tests got
    top = (
        "upstream"
        if counted["upstream"]
        else max(CATEGORIES, key=lambda c: (counted[c], -CATEGORIES.index(c)))
    )
    same = [v for v in verdicts if v.category == top]
    ranks = ("low", "medium", "high")
    confidence = min((v.confidence for v in same), key=ranks.index)
    if len(counted) > 1:
        confidence = "low"
        summary = (
            f"Of {len(verdicts)} triaged failing tests: "
            + ", ".join(f"{n} {c}" for c, n in counted.most_common())
            + f". The run's verdict: {top}. "
            + same[0].summary
        )
    elif len(same) == 1:
        summary = same[0].summary
    else:
        summary = f"All {len(same)} triaged failing tests: {top}. " + same[0].summary
    suspects = [v.suspected_upstream for v in same if v.suspected_upstream]
    return {
        "category": top,
        "confidence": confidence,
        "summary": summary,
        "suspected_upstream": Counter(suspects).most_common(1)[0][0] if suspects else None,
        "evidence": evidence,
    }
