"""``ci-relay select`` and ``ci-relay select-eval``: the selector from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ci_relay.cli.common import LabelOpt
from ci_relay.cli.consoles import err, out
from reuse_specs.errors import SpecErrors

if TYPE_CHECKING:  # the selector is imported when a command runs, not on every start
    from ci_relay.settings import Settings
    from test_selection.agents import Agent
    from test_selection.coverage.map import CoverageIndex
    from test_selection.selector import SelectorConfig
    from test_selection.types import PlannedTest, TestPlan

PATTERN_HELP = (
    "Glob of test files (repeatable); default: the repository's pytest configuration, else "
    "pytest's own default (test_*.py and *_test.py at any depth)."
)

RANKING_HELP = (
    "How test files are ranked: auto (the candidate that wins a backtest on the repository's "
    "own recent commits) | history | learned | blend | history+words | learned+words (the "
    "backtest chooses among that ranker's candidates) | one candidate as ranker/rule or "
    "ranker/rule/map-use, e.g. learned/model or history/spread/reached-first | prior (no "
    "backtest: history counting with prior numbers, as a history too short to replay gets)."
)

TRIAL_HELP = (
    "A candidate to put on trial (repeatable), named ranker/rule or ranker/rule/map-use, e.g. "
    "learned/model or history/spread/reached-first: the backtest measures it and the plan "
    "reports its figures, but it is never chosen."
)

MODE_HELP = (
    "ranked: the budget spent by the ranking, each changed function's most specific test "
    "first (with --coverage) | safe: no budget, every test the change reaches by the coverage "
    "map, by import or by name, and every test it edits."
)


def _agent(
    name: str, cache: Path, llm_url: str | None, llm_model: str | None, settings: Settings
) -> Agent:
    """The agent; the LLM endpoint from the options, else from the settings (CI_RELAY_LLM_*)."""
    from test_selection.agents import agent_by_name

    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    try:
        return agent_by_name(
            name, cache, llm_url or settings.llm_url, llm_model or settings.llm_model, key
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--agent") from None


def _load_settings() -> Settings:
    from pydantic import ValidationError

    from ci_relay.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        raise typer.BadParameter(f"bad settings (CI_RELAY_*): {exc}") from None


def _config(
    budget: str,
    agent: str,
    shards: int,
    durations: Path | None,
    always_run: list[str] | None,
    llm_url: str | None,
    llm_model: str | None,
    patterns: list[str] | None = None,
    label: str | None = None,
    ranking: str = "auto",
    mode: str = "ranked",
    trial: list[str] | None = None,
) -> SelectorConfig:
    from test_selection.plan import load_durations
    from test_selection.ranking.candidate import KEYS
    from test_selection.safe import MODES
    from test_selection.selector import RANKINGS, SelectorConfig
    from test_selection.types import Budget

    if ranking == "hand":
        raise typer.BadParameter(
            "the hand weights were retired: --ranking prior ranks without a backtest "
            "(history counting on prior numbers, as a history too short to replay gets)",
            param_hint="--ranking",
        )
    if ranking not in RANKINGS and ranking not in KEYS:
        raise typer.BadParameter(
            f"unknown ranking {ranking!r} (one of {', '.join(RANKINGS)}, or one candidate "
            "as ranker/rule or ranker/rule/map-use, e.g. history/spread/reached-first)",
            param_hint="--ranking",
        )
    if mode not in MODES:
        raise typer.BadParameter(
            f"unknown mode {mode!r} (one of {', '.join(MODES)})", param_hint="--mode"
        )
    from test_selection.ranking.candidate import on_trial

    try:
        on_trial(tuple(trial or ()))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--trial") from None

    try:
        parsed = Budget.parse(budget)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--budget") from None
    settings = _load_settings()
    cache = settings.effective_cache_dir
    config = SelectorConfig(
        budget=parsed,
        agent=_agent(agent, cache, llm_url, llm_model, settings),
        shards=shards,
        always_run=tuple(always_run or ()),
        cache_dir=cache,
        label=label,
        ranking=ranking,
        mode=mode,
        trial=tuple(trial or ()),
    )
    if patterns:
        config.patterns = tuple(patterns)
    if durations is not None:
        try:
            config.file_seconds = load_durations(durations)
        except (OSError, ValueError) as exc:
            raise typer.BadParameter(f"{durations}: {exc}", param_hint="--durations") from None
    return config


def _explain(plan: TestPlan, test: str) -> None:
    matches = [(p, True) for p in plan.selected if test in p.test.nodeid] + [
        (p, False) for p in plan.excluded if test in p.test.nodeid
    ]
    if not matches:
        raise typer.BadParameter(f"{test!r} is not in the universe of {plan.universe_size} tests")
    for item, chosen in matches[:5]:
        verdict = f"selected (shard {item.shard})" if chosen else "left out"
        out.print(f"[bold]{item.test.nodeid}[/]: {verdict}, score {item.score:.3g}", soft_wrap=True)
        for ev in sorted(item.evidence, key=lambda e: -e.score):
            out.print(
                f"  {ev.stage:<10} {ev.source:<18} {ev.score:+.3g}  {ev.reason}", soft_wrap=True
            )


def _table(plan: TestPlan, rows: list[PlannedTest], title: str) -> Table:
    table = Table(title=title)
    table.add_column("test", overflow="fold")
    table.add_column("score", justify="right")
    table.add_column("shard", justify="right")
    table.add_column("why", overflow="fold")
    for item in rows:
        table.add_row(
            item.test.nodeid, f"{item.score:.3g}", str(item.shard), "; ".join(item.reasons[:2])
        )
    return table


def _coverage_index(path: Path, upstream: Path) -> CoverageIndex:
    """The map for ``select --coverage``, refused (exit 2) when it is not this repository's
    or not a map this version reads."""
    from ci_relay.cli.coverage import repository_name
    from test_selection.coverage.map import CoverageMap, CoverageMapError
    from test_selection.coverage.select import check_map
    from test_selection.git import Repo

    try:
        cmap = CoverageMap.load(path)
        check_map(cmap, Repo(upstream), repository_name(upstream))
    except CoverageMapError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    return cmap.index()


def select_command(
    upstream: Annotated[Path, typer.Option(help="Upstream git checkout.")],
    base: Annotated[str, typer.Option(help="Base revision.")],
    head: Annotated[str, typer.Option(help="Head revision.")],
    spec: Annotated[
        list[Path] | None, typer.Option(help="Reuse spec(s) bounding the universe.")
    ] = None,
    budget: Annotated[str, typer.Option(help="15% | 600s | 200 | all")] = "15%",
    agent: Annotated[str, typer.Option(help="local | llm | none")] = "local",
    shards: Annotated[int, typer.Option(min=1, help="Shards to split the selection into.")] = 1,
    durations: Annotated[
        Path | None, typer.Option(help="test-times.json for budgets in seconds.")
    ] = None,
    always_run: Annotated[
        list[str] | None, typer.Option(help="Node-id glob always selected.")
    ] = None,
    llm_url: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL (…/v1).")] = None,
    llm_model: Annotated[str | None, typer.Option(help="Model name for --agent llm.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the TestPlan as JSON.")] = False,
    explain: Annotated[
        str | None, typer.Option(help="Show every stage's evidence for a test.")
    ] = None,
    pattern: Annotated[list[str] | None, typer.Option(help=PATTERN_HELP)] = None,
    label: LabelOpt = None,
    ranking: Annotated[str, typer.Option(help=RANKING_HELP)] = "auto",
    coverage: Annotated[
        Path | None,
        typer.Option(help="A per-test coverage map (ci-relay coverage record)."),
    ] = None,
    mode: Annotated[str, typer.Option(help=MODE_HELP)] = "ranked",
    trial: Annotated[list[str] | None, typer.Option(help=TRIAL_HELP)] = None,
) -> None:
    """Select the upstream tests a change needs (four stages), with reasons."""
    from test_selection.git import GitError
    from test_selection.layout import EmptyUniverse
    from test_selection.selector import select

    config = _config(
        budget,
        agent,
        shards,
        durations,
        always_run,
        llm_url,
        llm_model,
        pattern,
        label,
        ranking,
        mode,
        trial,
    )
    if coverage is not None:
        config.coverage = _coverage_index(coverage, upstream)
    try:
        with err.status("analysing the change and ranking tests…"):
            plan, _ = select(upstream, base, head, spec or None, config)
    except (GitError, EmptyUniverse) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    except SpecErrors as exc:
        for error in exc.errors:
            err.print(str(error), markup=False)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(plan.to_json(), indent=2))
        return
    if explain:
        _explain(plan, explain)
        return
    _print_plan(plan)


def select_eval_command(
    upstream: Annotated[Path, typer.Option(help="Upstream git repository.")],
    commits: Annotated[str, typer.Option(help="Revision range, e.g. HEAD~200..HEAD.")],
    budget: Annotated[str, typer.Option(help="15% | 600s | 200 | all")] = "15%",
    agent: Annotated[str, typer.Option(help="local | llm | none")] = "local",
    spec: Annotated[
        list[Path] | None, typer.Option(help="Reuse spec(s) bounding the universe.")
    ] = None,
    max_commits: Annotated[
        int, typer.Option(help="Evaluate at most this many commits (newest).")
    ] = 200,
    pattern: Annotated[list[str] | None, typer.Option(help=PATTERN_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    label: LabelOpt = None,
) -> None:
    """Replay history: hide each commit's test edits and measure what the selector finds."""
    from test_selection.evaluate import evaluate
    from test_selection.git import GitError

    config = _config(budget, agent, 1, None, None, None, None, pattern, label)
    try:
        with err.status("replaying history…") as status:
            report = evaluate(
                upstream,
                commits,
                config,
                spec or None,
                max_commits,
                lambda i, n, sha: status.update(f"commit {i}/{n} {sha[:12]}"),
            )
    except GitError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    data = report.to_json()
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table(
        title=f"{data['commits_evaluated']} of {data['commits_seen']} commits "
        "changed source and tests together"
    )
    for column in ("strategy", "test-file recall", "change recall", "selected fraction"):
        table.add_column(column, justify="right" if column != "strategy" else "left")
    for name, scores in data["strategies"].items():
        table.add_row(
            name,
            f"{scores['test_file_recall']:.3f}",
            f"{scores['change_recall']:.3f}",
            f"{scores['selection_fraction']:.3f}",
        )
    out.print(table)
    out.print(f"budget {budget}, agent {agent}; baselines select as many tests as the selector did")


def _print_plan(plan: TestPlan) -> None:
    """The selection as a table, then its ranking, budget, shares, notes and spec drift."""
    out.print(
        _table(plan, plan.selected, f"{len(plan.selected)} of {plan.universe_size} tests selected")
    )
    if plan.ranking:
        out.print(
            f"ranking: {plan.ranking['description']} (chosen by backtest on "
            f"{plan.ranking['backtest_commits']} past commits)",
            soft_wrap=True,
        )
    out.print(
        f"{plan.base[:12]}..{plan.head[:12]}  budget {plan.budget}  agent {plan.agent}  "
        f"changed files {plan.change['file_count']}  ops {', '.join(plan.change['ops']) or '-'}"
    )
    shares = plan.shares()
    out.print(
        f"took {shares['tests']:.1%} of the tests, {shares['test_files']:.1%} of the test "
        f"files, {shares['seconds']:.1%} of the estimated time; stages: "
        + ", ".join(f"{k} {v:.2f}s" for k, v in plan.timings.items()),
        soft_wrap=True,
    )
    for note in plan.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    for item in plan.spec_drift:
        hint = f"; likely renamed to {item['likely']!r}" if item["likely"] else ""
        out.print(
            f"spec drift: {item['file']}:{item['line']}: {item['message']}{hint}",
            markup=False,
            soft_wrap=True,
        )


def register(app: typer.Typer) -> None:
    app.command("select")(select_command)
    app.command("select-eval")(select_eval_command)
