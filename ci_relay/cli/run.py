"""``ci-relay run``: upstream tests under reuse specs on a backend, in-process or isolated;
``sample-upstream`` and ``spec-demo`` to try it without a PyTorch checkout."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ci_relay.cli.common import (
    BackendOpt,
    LabelOpt,
    UpstreamOpt,
    _check_backend,
    _check_label,
    _fail,
    _load_for_run,
    _print_drift,
    _print_input_generation,
    _relative,
    _settings,
    _spec_files,
    err,
    out,
)
from ci_relay.cli.consoles import counting_bar
from ci_relay.execution.outcomes import BAD_OUTCOMES, OUTCOMES
from ci_relay.execution.spec_run import (
    RunResult,
    TestOutcome,
    pytest_args,
    run_pytest,
)
from ci_relay.sample_upstream import SampleUpstreamError, build_sample_upstream
from reuse_specs.bundled import BUNDLED_SPECS
from reuse_specs.loader import LoadedSpec
from reuse_specs.upstream_check import SpecDrift

commands = typer.Typer()
REDRAW_SECONDS = 0.2  # the progress bar's redraws, at most this often


_SHORT = {
    "passed": "pass",
    "failed": "fail",
    "xfailed": "xfail",
    "xpassed": "xpass",
    "xpass_strict": "xpass!",
    "skipped": "skip",
}


def _summary(result: RunResult, drift: list[SpecDrift]) -> None:
    counts = result.counts
    modes = sorted({o.mode or "-" for o in result.outcomes})
    table = Table(
        title="results by spec mode",
        caption="xpass! = unexpected pass of an xfail_strict test",
    )
    table.add_column("mode", no_wrap=True)
    for name in OUTCOMES:
        table.add_column(_SHORT.get(name, name), justify="right")
    for mode in modes:
        per = [o.outcome for o in result.outcomes if (o.mode or "-") == mode]
        table.add_row(mode, *(str(per.count(name) or "") for name in OUTCOMES))
    table.add_row("[bold]total", *(f"[bold]{counts.get(name, 0)}" for name in OUTCOMES))
    out.print(table)
    for problem in result.problems:
        out.print(
            f"[red]{problem.outcome.upper()}[/] {problem.nodeid} "
            f"(mode {problem.mode}): {problem.message}",
            markup=True,
            soft_wrap=True,
        )
    notes = Counter(o.note for o in result.outcomes if o.note)
    for note, n in sorted(notes.items()):
        out.print(f"[yellow]NOTE[/] {n} test variant(s) {note}", soft_wrap=True)
    for collect_error in result.collection_errors:
        out.print(f"[red]COLLECTION ERROR[/] {collect_error}", soft_wrap=True)
    _print_drift(drift, out)


def run_specs(
    specs: list[Path],
    upstream: Path | None,
    backend: str,
    junit: Path | None,
    label: str | None,
    tests_file: Path | None = None,
    extra: list[str] | None = None,
) -> RunResult:
    """Validate, run with progress, print the summary; the body of ``ci-relay run``."""
    loaded, profile, root, drift = _load_for_run(specs, upstream, backend)
    _check_backend(profile)
    spec_files = _spec_files(specs)
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
    # no refresh thread: it would compete with the tests for the GIL
    progress = counting_bar(auto_refresh=False)
    task = progress.add_task(f"{profile.name}: collecting", total=None)

    def on_total(total: int) -> None:
        progress.update(task, total=total, description=f"{profile.name}: running")
        progress.refresh()

    last_drawn = [0.0]

    def on_outcome(outcome: TestOutcome) -> None:
        progress.advance(task)
        now = time.monotonic()
        if now - last_drawn[0] >= REDRAW_SECONDS:  # drawing per test costs more than a skip
            last_drawn[0] = now
            progress.refresh()
        if outcome.outcome in BAD_OUTCOMES:
            progress.console.print(
                f"[red]{outcome.outcome.upper()}[/] {outcome.nodeid}", soft_wrap=True
            )

    with progress:
        result, _ = run_pytest(
            lambda ini: pytest_args(
                spec_files,
                loaded,
                root,
                profile,
                ini,
                junit,
                label,
                tests_file=tests_file,
                extra=extra,
            ),
            root,
            on_total,
            on_outcome,
        )
    result.junit = junit
    _summary(result, drift)
    _print_input_generation(loaded, out)
    if junit is not None:
        out.print(f"JUnit XML: {junit}")
    return result


@commands.command("run")
def run(
    spec: Annotated[list[Path], typer.Option("--spec", help="Spec file or folder; repeatable.")],
    upstream: UpstreamOpt = None,
    backend: BackendOpt = "cpu",
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    label: LabelOpt = None,
    tests: Annotated[
        Path | None,
        typer.Option("--tests", help="Run only these tests (FILE::Class::test per line)."),
    ] = None,
    deselect: Annotated[
        Path | None, typer.Option(help="Leave out these pytest node ids (one per line).")
    ] = None,
    progress: Annotated[
        Path | None, typer.Option(help="Append a JSON line per test start and result here.")
    ] = None,
    per_test_timeout: Annotated[
        float | None, typer.Option(help="End the run when one test takes longer (seconds).")
    ] = None,
    runtime: Annotated[
        str | None,
        typer.Option(
            help="Run in isolated child processes: container (Docker API / Podman), sandbox "
            "(bubblewrap) or local (development only). Crashes and hangs then cost one test."
        ),
    ] = None,
    memory_mb: Annotated[int, typer.Option(help="Memory limit per test process (MiB).")] = 4096,
) -> None:
    """Run the upstream tests a spec covers on a backend.

    Exit 0 when every variant behaved as its mode says; 1 on a must-pass failure,
    an error, or an unexpected pass of xfail_strict; 2 on bad input (nothing
    run); 3 when tests could not be collected; 4 when nothing was selected.
    """
    if tests is not None and not tests.is_file():
        raise _fail(f"--tests {tests}: no such file")
    _check_label(label, spec)
    if runtime is not None:
        code = _run_isolated(
            spec, upstream, backend, junit, tests, runtime, per_test_timeout, memory_mb, label
        )
        raise typer.Exit(code)
    extra: list[str] = []
    if deselect is not None:
        extra += ["--reuse-deselect", str(deselect)]
    if progress is not None:
        extra += ["-p", "ci_relay.execution.progress_plugin", "--progress-log", str(progress)]
        if per_test_timeout:
            extra += ["--per-test-timeout", str(per_test_timeout)]
    result = run_specs(spec, upstream, backend, junit, label, tests, extra)
    raise typer.Exit(result.exit_code)


def _all_generic_tests(loaded: LoadedSpec, root: Path) -> list[str]:
    from reuse_specs.upstream_index import generic_test_ids

    return [test for path in loaded.test_files() for test in generic_test_ids(path, root)]


def _run_isolated(
    specs: list[Path],
    upstream: Path | None,
    backend: str,
    junit: Path | None,
    tests_file: Path | None,
    runtime_name: str,
    per_test_timeout: float | None,
    memory_mb: int,
    label: str | None = None,
) -> int:
    """The shard runner: child processes in a runtime, resumed after every crash."""
    import tempfile

    from ci_relay.execution.choice import runtime_options
    from ci_relay.execution.junit import write_junit
    from ci_relay.execution.runtimes import Limits, RuntimeUnavailable, get_runtime
    from ci_relay.execution.shard import ShardRequest, run_shard

    loaded, profile, root, drift = _load_for_run(specs, upstream, backend)
    try:
        runtime = get_runtime(runtime_name, profile.name, options=runtime_options(_settings()))
    except RuntimeUnavailable as exc:
        raise _fail(str(exc)) from None
    if runtime.name != "container":  # a container has its own software: it checks inside
        _check_backend(profile)
    if runtime.name == "local":
        err.print("[yellow]runtime local: no isolation (development only)[/]")
    if tests_file is not None:
        tests = [t.strip() for t in tests_file.read_text().splitlines() if t.strip()]
    else:
        tests = _all_generic_tests(loaded, root)
    with tempfile.TemporaryDirectory(prefix="ci-relay-shard-") as scratch:
        request = ShardRequest(
            tests=tests,
            specs=[p.resolve() for p in _spec_files(specs)],
            upstream=root,
            scratch=Path(scratch),
            backend=profile.name,
            per_test_timeout=per_test_timeout or 600.0,
            limits=Limits(memory_mb=memory_mb),
            label=label,
        )
        with err.status(f"{runtime.name}: running {len(tests)} test(s)…"):
            report = run_shard(runtime, request)
    result = RunResult(outcomes=list(report.results.values()))
    if report.error:
        result.collection_errors.append(report.error + "\n" + "\n".join(report.log[-1:]))
    _summary(result, drift)
    _print_input_generation(loaded, out)
    flaky = [r.nodeid for r in report.results.values() if r.flaky]
    for nodeid in flaky:
        out.print(f"[yellow]FLAKY[/] {nodeid}", soft_wrap=True)
    out.print(f"{runtime.name}: {report.processes} process(es), {len(report.crashed)} crashed")
    if junit is not None:
        write_junit(junit, result.outcomes)
        out.print(f"JUnit XML: {junit}")
    return result.exit_code


@commands.command("sample-upstream")
def sample_upstream(
    dest: Annotated[Path, typer.Argument(help="Folder to create (absent or empty).")],
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty folder.")] = False,
) -> None:
    """Build a small git repository laid out like PyTorch, with several commits of history."""
    try:
        sample = build_sample_upstream(dest, force=force)
    except SampleUpstreamError as exc:
        raise _fail(str(exc)) from None
    out.print(f"sample upstream at {sample.path}")
    for commit in sample.commits:
        out.print(f"  {commit.sha[:12]} {commit.message}", markup=False)


@commands.command("spec-demo")
def spec_demo(
    workdir: Annotated[
        Path, typer.Option("--workdir", help="Where the sample upstream and results go.")
    ] = Path(".ci-relay/spec-demo"),
) -> None:
    """Build the sample upstream and run the bundled Spyre specs on it with the cpu backend."""
    try:
        sample = build_sample_upstream(workdir / "upstream", force=True)
    except SampleUpstreamError as exc:
        raise _fail(str(exc)) from None
    out.print(f"sample upstream: {sample.path} (head {sample.head[:12]})")
    specs = [_relative(p) for p in sorted(BUNDLED_SPECS.glob("*.yaml"))]
    if not specs:
        raise _fail(f"no bundled spec in {BUNDLED_SPECS}: is this a complete installation?")
    out.print("specs: " + ", ".join(p.name for p in specs))
    result = run_specs(specs, sample.path, "cpu", workdir / "junit.xml", None)
    verdict = "as the specs expect" if result.exit_code == 0 else "NOT as the specs expect"
    out.print(f"[bold]{len(result.outcomes)} test variants ran {verdict}[/]")
    raise typer.Exit(result.exit_code)
