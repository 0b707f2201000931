"""Narrow a range of upstream commits to the first one where a test fails, in few runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Probe = Literal["good", "bad", "skip"]


@dataclass
class Bisection:
    """The first bad commit when the steps sufficed, else the narrowest range found."""

    first_bad: str | None
    good: str  # the newest commit seen passing (the range's base at first)
    bad: str  # the oldest commit seen failing (the range's head at first)
    steps: list[tuple[str, Probe]] = field(default_factory=list)
    note: str | None = None  # why it stopped short


def bisect(
    base: str, commits: list[str], probe: Callable[[str], Probe], max_steps: int
) -> Bisection:
    """``commits`` are base's successors up to the head, oldest first; ``base`` passes and
    the last commit fails. A commit that cannot be tested (it does not build, the test is
    not there) stops the search with what it knows rather than guessing past it."""
    one = "test"
    return bisect_together(base, commits, [one], lambda sha, _: {one: probe(sha)}, max_steps)[one]


def bisect_together(
    base: str,
    commits: list[str],
    tests: list[str],
    probe: Callable[[str, list[str]], dict[str, Probe]],
    max_steps: int,
) -> dict[str, Bisection]:
    """:func:`bisect` for several tests at once: each probe runs every test still in the
    same part of the range, and the group splits where their answers differ, so tests the
    same commit broke cost one bisection between them (device time, not runs per test)."""
    if not commits:
        raise ValueError("nothing to bisect: the range is empty")
    out = {t: Bisection(None, base, commits[-1]) for t in tests}
    # (low, high, tests): commits[low] (or base, at -1) good, commits[high] bad for them
    pending: list[tuple[int, int, list[str]]] = [(-1, len(commits) - 1, list(tests))]
    while pending:
        low, high, group = pending.pop()
        if high - low <= 1:
            for t in group:
                out[t].first_bad = commits[high]
            continue
        if len(out[group[0]].steps) >= max_steps:
            for t in group:
                out[t].note = f"stopped after {max_steps} step(s) with {high - low} commits left"
            continue
        middle = (low + high) // 2
        answers = probe(commits[middle], group)
        good, bad = [], []
        for t in group:
            answer = answers.get(t, "skip")
            out[t].steps.append((commits[middle], answer))
            if answer == "good":
                out[t].good = commits[middle]
                good.append(t)
            elif answer == "bad":
                out[t].bad = commits[middle]
                bad.append(t)
            else:
                out[t].note = f"stopped at {commits[middle][:12]}: the test could not run there"
        if good:
            pending.append((middle, high, good))
        if bad:
            pending.append((low, middle, bad))
    return out
