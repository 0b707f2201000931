"""What every command group shares: the consoles, the common options, errors and exit codes,
reading specs and settings."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from ci_relay.cli.consoles import err as err
from ci_relay.cli.consoles import out as out
from ci_relay.execution.spec_run import EXIT_BAD_INPUT, EXIT_NOTHING_SELECTED
from reuse_specs.backends import (
    BACKENDS_DIR_ENV,
    Backend,
    DeclarationErrors,
    UnknownBackend,
    add_backends_dir,
    get_backend,
)
from reuse_specs.errors import SpecErrors
from reuse_specs.loader import LoadedSpec, load_specs
from reuse_specs.upstream_check import SpecDrift, find_drift

if TYPE_CHECKING:
    from ci_relay.settings import Settings


UpstreamOpt = Annotated[
    Path | None,
    typer.Option(
        "--upstream",
        help="PyTorch checkout (or sample upstream); sets ${TORCH_ROOT}. Default: $TORCH_ROOT.",
    ),
]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        help="Backend profile: cpu, spyre-emu, spyre, or one declared in a folder of "
        f"${BACKENDS_DIR_ENV} (`ci-relay backends list`).",
    ),
]
LabelOpt = Annotated[
    str | None,
    typer.Option(
        "--label",
        envvar="TORCH_SPYRE_TEST_TYPE",
        help="Run only spec entries whose labels (or their file's) include this one; the "
        "others are skipped. Default: $TORCH_SPYRE_TEST_TYPE, as in torch-spyre.",
    ),
]


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _emit_schema(schema: dict[str, object], output: Path | None, what: str) -> None:
    """A JSON Schema on stdout, or written to ``output`` (``what``: whose, for the message)."""
    import json

    text = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _fail(f"cannot write {output}: {exc.strerror}") from None
    err.print(f"wrote the {what} schema to {output}")


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


def _check_label(label: str | None, specs: list[Path]) -> None:
    """Refuse a label that is no tier and that no spec carries: it would skip every test."""
    if label is None:
        return
    from reuse_specs.tiers import labels_in, unknown_label

    used: set[str] = set()
    for file in _spec_files(specs):
        try:
            used |= labels_in(file.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue  # the loader reports a file it cannot read
    why = unknown_label(label, used)
    if why:
        raise _fail(f"--label (or TORCH_SPYRE_TEST_TYPE): {why}")


def _load_for_run(
    specs: list[Path], upstream: Path | None, backend: str
) -> tuple[LoadedSpec, Backend, Path, list[SpecDrift]]:
    """The specs against the tree, the backend profile, the tree, and the spec's drift: what
    it lists that this revision lacks is reported, and everything else still runs."""
    root = _upstream_dir(upstream)
    profile = _backend(backend)
    try:
        loaded = load_specs(_spec_files(specs), root, profile.name)
        drift = find_drift(loaded)
    except SpecErrors as exc:
        _report_spec_errors(exc)
        raise _fail(f"{len(exc.errors)} error(s) in the spec; nothing was run") from None
    _print_drift(drift, err)
    if not loaded.test_files():
        raise _fail(
            "none of the files the spec lists exists at this upstream revision; nothing was run",
            EXIT_NOTHING_SELECTED,
        )
    return loaded, profile, root, drift


def _print_input_generation(loaded: LoadedSpec, console: Console) -> None:
    """Which input-generation keys a run applies and which it cannot (torch-spyre's)."""
    applied, not_applied = loaded.input_generation()
    for line in applied:
        console.print(f"[green]input generation applied:[/] {line}", soft_wrap=True)
    for line in not_applied:
        console.print(f"[yellow]input generation NOT applied:[/] {line}", soft_wrap=True)


def _print_drift(drift: list[SpecDrift], console: Console) -> None:
    """The spec's drift as warnings: one line each, with the likely rename."""
    if not drift:
        return
    console.print(
        f"[yellow]spec drift:[/] {len(drift)} listed name(s) or path(s) not in this upstream "
        "revision; the rest runs (`ci-relay specs check --upstream` lists them as errors)"
    )
    for item in drift:
        console.print(f"  {item}", markup=False, soft_wrap=True)


def _register_backends() -> None:
    """The declarations of the settings' ``backends_dir`` and the policy's join the bundled."""
    from ci_relay.policy import register_backends_dir

    settings = _settings()
    if settings.backends_dir is not None:
        add_backends_dir(settings.backends_dir)
    register_backends_dir(settings.policy_file)


def _backend(name: str) -> Backend:
    """The declared backend ``name``, or a clear refusal (unknown, or a bad declaration)."""
    _register_backends()
    try:
        return get_backend(name)
    except UnknownBackend as exc:
        raise _fail(str(exc)) from None
    except DeclarationErrors as exc:
        _report_spec_errors(exc)
        raise _fail(f"{len(exc.errors)} error(s) in the backend declarations") from None


def _check_backend(profile: Backend) -> None:
    from reuse_specs.backends import BackendUnavailable

    setting = profile.devices.setting if profile.devices else None
    settings = _settings()
    if setting is not None and setting not in type(settings).model_fields:
        raise _fail(
            f"{profile.devices.location if profile.devices else profile.declaration}: "
            f"preflight.devices.setting {setting!r} is not a ci-relay setting"
        )
    try:
        profile.check(getattr(settings, setting) if setting else None)
    except BackendUnavailable as exc:
        raise _fail(str(exc)) from None


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


def _settings(**overrides: object) -> Settings:
    from pydantic import ValidationError

    from ci_relay.settings import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        raise _fail(f"bad settings: {exc}") from None


def _configure_logging() -> None:
    from ci_relay.logs import configure_logging

    configure_logging()


def post_to_relay(url: str, token: str, body: Mapping[str, object], what: str) -> dict[str, Any]:
    """POST ``body`` to a relay's dispatch-token route and return its 202 answer; any other
    answer, or no answer, exits 2 with the relay's reason (``what``: the thing refused)."""
    import httpx

    try:
        response = httpx.post(
            url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
    except httpx.HTTPError as exc:
        raise _fail(f"could not reach {url}: {exc}") from None
    if response.status_code != 202:
        try:
            reason = response.json().get("error", response.text)
        except ValueError:
            reason = response.text
        raise _fail(f"the relay refused the {what} (HTTP {response.status_code}): {reason}")
    answer: dict[str, Any] = response.json()
    return answer
