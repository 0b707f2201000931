"""The ``ci-relay`` command line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from ci_relay.cli import report as report_commands
from ci_relay.cli import select as select_commands
from ci_relay.execution.outcomes import BAD_OUTCOMES, OUTCOMES
from ci_relay.execution.spec_run import (
    EXIT_BAD_INPUT,
    RunResult,
    TestOutcome,
    pytest_args,
    run_pytest,
)
from ci_relay.sample_upstream import SampleUpstreamError, build_sample_upstream
from reuse_specs import BUNDLED_SPECS
from reuse_specs.backends import BACKENDS, Backend, UnknownBackend, get_backend
from reuse_specs.errors import SpecErrors
from reuse_specs.loader import LoadedSpec, load_specs
from reuse_specs.upstream_check import check_against_upstream

if TYPE_CHECKING:
    from ci_relay.settings import Settings


app = typer.Typer(
    help="Run the upstream PyTorch tests that matter for an out-of-tree backend.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
specs_app = typer.Typer(help="Validate and inspect reuse specs.", no_args_is_help=True)
app.add_typer(specs_app, name="specs")
select_commands.register(app)
report_commands.register(app)

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

UpstreamOpt = Annotated[
    Path | None,
    typer.Option(
        "--upstream",
        help="PyTorch checkout (or sample upstream); sets ${TORCH_ROOT}. Default: $TORCH_ROOT.",
    ),
]
BackendOpt = Annotated[
    str, typer.Option("--backend", help=f"Backend profile: {', '.join(sorted(BACKENDS))}.")
]
LabelOpt = Annotated[
    str | None, typer.Option("--label", help="Run only tests whose labels include this one.")
]


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _spec_files(paths: list[Path]) -> list[Path]:
    """Files as given; a directory stands for the YAML files directly in it."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))
        else:
            files.append(path)
    return files


def _relative(path: Path) -> Path:
    """Shorter paths in messages when the file is below the working directory."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _report_spec_errors(exc: SpecErrors) -> None:
    for error in exc.errors:
        out.print(str(error), markup=False, soft_wrap=True)


def _upstream_dir(upstream: Path | None) -> Path:
    if upstream is None and os.environ.get("TORCH_ROOT"):
        upstream = Path(os.environ["TORCH_ROOT"])
    if upstream is None:
        raise _fail("no upstream tree: pass --upstream DIR or set TORCH_ROOT")
    if not upstream.is_dir():
        raise _fail(f"upstream {upstream} is not a directory")
    return upstream.resolve()


def _load_for_run(
    specs: list[Path], upstream: Path | None, backend: str
) -> tuple[LoadedSpec, Backend, Path]:
    root = _upstream_dir(upstream)
    try:
        profile = get_backend(backend)
        loaded = load_specs(_spec_files(specs), root, profile.name)
        check_against_upstream(loaded)
    except UnknownBackend as exc:
        raise _fail(str(exc)) from None
    except SpecErrors as exc:
        _report_spec_errors(exc)
        raise _fail(f"{len(exc.errors)} error(s) in the spec; nothing was run") from None
    return loaded, profile, root


def _check_backend(profile: Backend) -> None:
    from reuse_specs.backends import BackendUnavailable

    try:
        profile.check(_settings().spyre_device_glob)
    except BackendUnavailable as exc:
        raise _fail(str(exc)) from None


@specs_app.command("check")
def specs_check(
    paths: Annotated[list[Path], typer.Argument(help="Spec files or folders of them.")],
    upstream: UpstreamOpt = None,
) -> None:
    """Validate spec files; with an upstream tree also check paths, globs and test names.

    Prints every error as FILE:LINE:COL and exits 1 when there is any.
    """
    files = _spec_files(paths)
    if not files:
        raise _fail("no spec files found")
    if upstream is not None and not upstream.is_dir():
        raise _fail(f"upstream {upstream} is not a directory")
    try:
        loaded = load_specs(files, upstream)
        if loaded.upstream is not None:
            check_against_upstream(loaded)
    except SpecErrors as exc:
        _report_spec_errors(exc)
        err.print(f"[red]{len(exc.errors)} error(s)[/] in {len(files)} spec file(s)")
        raise typer.Exit(1) from None
    for where in loaded.opaque_inputs:
        out.print(
            f"{where}: note: input-generation blocks are accepted but not applied by ci-relay",
            markup=False,
        )
    tests = sum(len(f.rules) for f in loaded.files)
    scope = (
        f"against {loaded.upstream}"
        if loaded.upstream
        else "structure only (pass --upstream to check paths and test names)"
    )
    out.print(
        f"[green]OK[/] {len(files)} spec file(s), {len(loaded.files)} file entries, "
        f"{tests} test entries; {scope}"
    )


@specs_app.command("show")
def specs_show(
    specs: Annotated[list[Path], typer.Argument(help="Spec files or folders of them.")],
    upstream: UpstreamOpt = None,
    backend: BackendOpt = "cpu",
    label: LabelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every test variant the spec covers, with its mode and why (collects, runs nothing)."""
    loaded, profile, root = _load_for_run(specs, upstream, backend)
    _check_backend(profile)
    spec_files = _spec_files(specs)
    with err.status("collecting upstream tests…"):
        result, decided = run_pytest(
            lambda ini: pytest_args(
                spec_files, loaded, root, profile, ini, label=label, collect_only=True
            ),
            root,
        )
    if result.collection_errors:
        for problem in result.collection_errors:
            err.print(problem, markup=False)
        raise _fail("could not collect the upstream tests", 3)
    if as_json:
        rows = [
            {
                "nodeid": nodeid,
                "class": variant.class_name,
                "test": variant.test_name,
                "op": variant.op,
                "module": variant.module,
                "dtype": variant.dtype,
                "mode": decision.mode.value,
                "reason": decision.reason,
                "tags": list(decision.tags),
                "precision": decision.precision.model_dump() if decision.precision else None,
            }
            for nodeid, variant, decision in decided
        ]
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(decided)} test variants on backend {profile.name}")
    table.add_column("test")
    table.add_column("mode")
    table.add_column("why", overflow="fold")
    for nodeid, _variant, decision in decided:
        table.add_row(nodeid, decision.mode.value, decision.reason)
    out.print(table)


_SHORT = {
    "passed": "pass",
    "failed": "fail",
    "xfailed": "xfail",
    "xpassed": "xpass",
    "xpass_strict": "xpass!",
    "skipped": "skip",
}


def _summary(result: RunResult) -> None:
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
    for collect_error in result.collection_errors:
        out.print(f"[red]COLLECTION ERROR[/] {collect_error}", soft_wrap=True)


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
    loaded, profile, root = _load_for_run(specs, upstream, backend)
    _check_backend(profile)
    spec_files = _spec_files(specs)
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        auto_refresh=False,  # a refresh thread would compete with the tests for the GIL
    )
    task = progress.add_task(f"{profile.name}: collecting", total=None)

    def on_total(total: int) -> None:
        progress.update(task, total=total, description=f"{profile.name}: running")
        progress.refresh()

    def on_outcome(outcome: TestOutcome) -> None:
        progress.advance(task)
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
    _summary(result)
    if junit is not None:
        out.print(f"JUnit XML: {junit}")
    return result


@app.command("run")
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
    if runtime is not None:
        code = _run_isolated(
            spec, upstream, backend, junit, tests, runtime, per_test_timeout, memory_mb
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
    from reuse_specs.upstream_index import index_test_file

    out = []
    for path in loaded.test_files():
        rel = path.relative_to(root).as_posix()
        index = index_test_file(path)
        out += [
            f"{rel}::{cls}::{m}" for cls, methods in index.classes.items() for m in sorted(methods)
        ]
        out += [f"{rel}::{f}" for f in sorted(index.functions) if f.startswith("test")]
    return out


def _run_isolated(
    specs: list[Path],
    upstream: Path | None,
    backend: str,
    junit: Path | None,
    tests_file: Path | None,
    runtime_name: str,
    per_test_timeout: float | None,
    memory_mb: int,
) -> int:
    """The shard runner: child processes in a runtime, resumed after every crash."""
    import tempfile

    from ci_relay.execution.choice import runtime_options
    from ci_relay.execution.junit import write_junit
    from ci_relay.execution.runtimes import Limits, RuntimeUnavailable, get_runtime
    from ci_relay.execution.shard import ShardRequest, run_shard

    loaded, profile, root = _load_for_run(specs, upstream, backend)
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
        )
        with err.status(f"{runtime.name}: running {len(tests)} test(s)…"):
            report = run_shard(runtime, request)
    result = RunResult(outcomes=list(report.results.values()))
    if report.error:
        result.collection_errors.append(report.error + "\n" + "\n".join(report.log[-1:]))
    _summary(result)
    flaky = [r.nodeid for r in report.results.values() if r.flaky]
    for nodeid in flaky:
        out.print(f"[yellow]FLAKY[/] {nodeid}", soft_wrap=True)
    out.print(f"{runtime.name}: {report.processes} process(es), {len(report.crashed)} crashed")
    if junit is not None:
        write_junit(junit, result.outcomes)
        out.print(f"JUnit XML: {junit}")
    return result.exit_code


images_app = typer.Typer(help="Test-runner container images.", no_args_is_help=True)
app.add_typer(images_app, name="images")


@images_app.command("build")
def images_build(
    backend: Annotated[
        list[str] | None,
        typer.Option(
            help="Backends to build runner images for "
            "(default: every backend of the policy file, else cpu)."
        ),
    ] = None,
    relay: Annotated[
        bool, typer.Option("--relay", help="Also build the relay's own image (API and workers).")
    ] = False,
) -> None:
    """Build images offline (debootstrap base, local wheelhouse); reuses what exists."""
    import subprocess

    from reuse_specs.backends import UnknownBackend, get_backend

    backends = backend or _policy_backends() or ["cpu"]
    for name in backends:
        try:
            get_backend(name)
        except UnknownBackend as exc:
            raise _fail(str(exc)) from None
    root = Path(__file__).resolve().parents[2]  # ci_relay/cli/main.py -> the checkout
    if not (root / "pyproject.toml").is_file() or not (root / "docker").is_dir():
        raise _fail(f"{root} is not a ci-relay source checkout (images build from one)")
    script = root / "ci_relay" / "execution" / "build_images.sh"
    targets = [f"runner-{b}" for b in backends] + (["relay"] if relay else [])
    if subprocess.run(["bash", str(script), str(root), *targets]).returncode:
        raise _fail("image build failed (see the messages above)", 1)
    ready = ", ".join(f"localhost/ci-relay-{t}:latest" for t in targets)
    out.print(f"image(s) ready: {ready}")


def _policy_backends() -> list[str]:
    """Every backend the configured policy file runs (what this relay's workers need)."""
    from ci_relay.policy import PolicyError, load_policy

    settings = _settings()
    if settings.policy_file is None:
        return []
    try:
        policy = load_policy(settings.policy_file)
    except PolicyError as exc:
        raise _fail(str(exc)) from None
    return sorted({b for repo in policy.repositories.values() for b in repo.backends})


def _say_demo_runtimes(backends: tuple[str, ...]) -> None:
    """Where the demo's shards will run, and why not in a container when they cannot."""
    from ci_relay.execution.choice import shard_runtime

    # the demo's relay runs with CI_RELAY_RUNTIME=auto as a local demo: a machine without
    # Podman or bubblewrap runs the sample's tests unisolated, and the run page says so
    settings = _settings(runtime="auto", local_demo=True)
    for backend in backends:
        runtime = shard_runtime(settings, backend, say=lambda msg: err.print(f"[yellow]{msg}[/]"))
        where = "local (NOT isolated)" if runtime.name == "local" else runtime.name
        out.print(f"{backend} shards run in: {where}")


@app.command("sample-upstream")
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


@app.command("spec-demo")
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


@app.command("demo")
def demo(
    workdir: Annotated[
        Path, typer.Option("--workdir", help="Where the relay's data and the sample go.")
    ] = Path(".ci-relay/demo"),
    exit_when_done: Annotated[
        bool, typer.Option("--exit-when-done", help="Stop the relay once the result is shown.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the result.")] = 600,
) -> None:
    """Start the relay on this machine (embedded mode) and feed it one sample upstream change."""
    from ci_relay.demo import new_demo, pull_request_payload, send_webhook, wait_for_run

    relay, sample = new_demo(workdir.resolve())
    log_file = relay.workdir / "relay.log"
    out.print(f"sample upstream: {sample.path} ({len(sample.commits)} commits)")
    _say_demo_runtimes(relay.backends)
    relay.start(sample, log_file)
    try:
        with err.status(f"starting the relay on {relay.url} (log: {log_file})…"):
            relay.wait_ready()
        payload = pull_request_payload(sample, head_index=len(sample.commits) - 2)
        response = send_webhook(relay.url, relay.secret, "pull_request", payload)
        ack = response.json()
        out.print(
            f"sent pull_request #{payload['number']} (head {payload['after'][:12]}: "
            f"{payload['pull_request']['title']}) -> HTTP {response.status_code} {ack}"
        )
        if response.status_code != 202:
            raise _fail("the relay did not accept the webhook", 1)
        with err.status("selecting and running the upstream tests…"):
            change = wait_for_run(relay.url, ack["delivery_id"], timeout)
        for run in change["runs"]:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(run["counts"].items()))
            out.print(
                f"run {run['id']} on {run['backend']} ({run['level']}): "
                f"[bold]{run['conclusion']}[/] — {counts}"
            )
            out.print(f"results: {relay.url}/runs/{run['id']}   (JSON: /api/runs/{run['id']})")
        out.print(f"dashboard: {relay.url}/")
        out.print(f"commit: {relay.url}/commits/{payload['after']}")
        out.print(f"changes: {relay.url}/api/changes   deliveries: {relay.url}/api/deliveries")
        if not exit_when_done:
            out.print("the relay keeps running; press Ctrl-C to stop it")
            assert relay.process is not None
            relay.process.wait()
    except KeyboardInterrupt:
        pass
    except (TimeoutError, RuntimeError) as exc:
        raise _fail(f"{exc} (see {log_file})", 1) from None
    finally:
        relay.stop()


def _settings(**overrides: object) -> Settings:
    from pydantic import ValidationError

    from ci_relay.settings import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        raise _fail(f"bad settings: {exc}") from None


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    worker: Annotated[
        bool | None,
        typer.Option(
            "--worker/--no-worker",
            help="Start a worker with the API (default: yes with the embedded broker).",
        ),
    ] = None,
    local_demo: Annotated[
        bool, typer.Option("--local-demo", help="Allow unsigned webhooks (local demo only).")
    ] = False,
) -> None:
    """Run the relay's API (webhooks, JSON API, /healthz, /readyz, /metrics)."""
    from ci_relay.service.processes import ServiceError
    from ci_relay.service.processes import serve as run_server

    settings = _settings(local_demo=True if local_demo else None)
    _configure_logging()
    try:
        run_server(settings, host, port, settings.embedded_broker if worker is None else worker)
    except ServiceError as exc:
        raise _fail(str(exc)) from None


@app.command("worker")
def worker(
    queues: Annotated[
        str | None,
        typer.Option(help="Comma-separated queues (default: all; exec.<backend> for one device)."),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Tasks at once.")] = 2,
    reconcile_every: Annotated[float, typer.Option(help="Seconds between reconciler passes.")] = 15,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve this worker's Prometheus metrics on this port.")
    ] = None,
) -> None:
    """Run a Celery worker for the relay's queues, with the reconciler."""
    from ci_relay.service.processes import all_queues, run_worker

    _configure_logging()
    run_worker(_settings(), queues or all_queues(), concurrency, reconcile_every, metrics_port)


@app.command("replay")
def replay(
    source: Annotated[str, typer.Argument(help="A stored delivery id, or a JSON payload file.")],
    event: Annotated[
        str | None, typer.Option(help="Event name for a payload file (X-GitHub-Event).")
    ] = None,
) -> None:
    """Re-inject a stored or saved delivery as a new delivery and queue it."""
    from ci_relay.replay import ReplayError, replay_delivery

    try:
        pk = replay_delivery(_settings(), source, event)
    except ReplayError as exc:
        raise _fail(str(exc)) from None
    out.print(f"queued as delivery {pk}")


def _configure_logging() -> None:
    from ci_relay.logs import configure_logging

    configure_logging()
