"""``ci-relay specs check|show|schema|profile-check``: validate reuse specs, see what they
select, give editors the format's JSON Schema, keep the emulator's profile in step with them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ci_relay.cli.common import (
    BackendOpt,
    LabelOpt,
    UpstreamOpt,
    _check_backend,
    _check_label,
    _emit_schema,
    _fail,
    _load_for_run,
    _print_input_generation,
    _report_spec_errors,
    _settings,
    _spec_files,
    err,
    out,
)
from ci_relay.execution.spec_run import (
    pytest_args,
    run_pytest,
)
from reuse_specs.errors import SpecErrors
from reuse_specs.loader import load_specs
from reuse_specs.upstream_check import check_against_upstream, hardware_generic_listings

specs_app = typer.Typer(help="Validate and inspect reuse specs.", no_args_is_help=True)


@specs_app.command("check")
def specs_check(
    paths: Annotated[list[Path], typer.Argument(help="Spec files or folders of them.")],
    upstream: UpstreamOpt = None,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Fail (exit 1) on torch-spyre's old tier names and on a config without "
            "labels (its CHECK 0), as its make check-all-configs does.",
        ),
    ] = False,
) -> None:
    """Validate spec files; with an upstream tree also check paths, globs and test names.

    Prints every error as FILE:LINE:COL and exits 1 when there is any. Labels are read
    against torch-spyre's tier ladder: old tier names and a config without labels are
    named (errors with --strict).
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
    if loaded.upstream is not None:
        for warning in hardware_generic_listings(loaded):
            out.print(warning, markup=False, soft_wrap=True)
    for key, where in loaded.opaque_inputs:
        out.print(
            f"{where}: note: {key} is accepted but not applied by ci-relay",
            markup=False,
        )
    if _label_notes(files, strict):
        raise typer.Exit(1)
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


def _label_notes(files: list[Path], strict: bool) -> int:
    """Print what the tier ladder says of each spec's labels; how many are errors."""
    from reuse_specs.tiers import label_notes

    errors = 0
    for file in files:
        for note in label_notes(file.read_text(encoding="utf-8", errors="replace")):
            fatal = strict and note.kind != "no-ladder"
            errors += fatal
            where = f"{file}:{note.line}" if note.line else str(file)
            kind = "error" if fatal else "note"
            out.print(f"{where}: {kind}: {note.text}", markup=False, soft_wrap=True)
    if errors:
        err.print(f"[red]{errors} label error(s)[/] (--strict) in {len(files)} spec file(s)")
    return errors


@specs_app.command("fix-labels")
def specs_fix_labels(
    paths: Annotated[list[Path], typer.Argument(help="Spec files or folders of them.")],
    check: Annotated[
        bool, typer.Option("--check", help="Change nothing; exit 1 if a file would change.")
    ] = False,
) -> None:
    """Rewrite torch-spyre's old tier names (core, device_critical, full) to the new ones
    (unit, integration, regression) in place, keeping comments, quoting and layout."""
    from reuse_specs.tiers import rename_old_labels

    files = _spec_files(paths)
    if not files:
        raise _fail("no spec files found")
    changed = 0
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _fail(f"{file}: cannot read it as UTF-8 text ({exc}); nothing changed") from None
        new, done = rename_old_labels(text)
        if not done:
            continue
        changed += 1
        for line, old, name in done:
            out.print(f"{file}:{line}: {old} -> {name}", markup=False, soft_wrap=True)
        if not check:
            tmp = file.with_name(f".{file.name}.fix-labels")
            tmp.write_text(new, encoding="utf-8")
            tmp.replace(file)
    verb = "would change" if check else "changed"
    out.print(f"{changed} of {len(files)} spec file(s) {verb}")
    if check and changed:
        raise typer.Exit(1)


@specs_app.command("schema")
def specs_schema(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the schema here instead of to stdout."),
    ] = None,
) -> None:
    """Print the JSON Schema of the spec format, for editors (completion, errors as you type).

    Generated from the models the loader validates with. Put
    ``# yaml-language-server: $schema=PATH-OR-URL`` on a spec's first line for editors that
    use the YAML language server (VS Code's YAML extension, Neovim, Helix, ...).
    """
    from reuse_specs.schema import json_schema

    _emit_schema(json_schema(), output, "spec")


@specs_app.command("profile-check")
def specs_profile_check(
    paths: Annotated[list[Path], typer.Argument(help="Spec files or folders of them.")],
    profile_file: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="spyre-emu profile YAML (default: $SPYRE_EMU_PROFILE, else the bundled one, "
            "which follows torch-spyre's published list).",
        ),
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 on warnings too, not only on errors.")
    ] = False,
) -> None:
    """Cross-check a spyre-emu profile against the specs' supported dtypes and ops.

    Errors: what the specs support but the profile refuses (fails on the emulator only),
    profile dtypes no spec supports. Warnings: force_xfail dtypes and ops the profile runs
    anyway (XPASS on the emulator), names that resolve to nothing (with what was tried).
    OpInfo names (short forms too) are traced to the aten overloads they reach with their own
    sample inputs on the CPU; aten names and the card's kernel names (spyre_emu's alias table)
    are asked of the profile directly.
    """
    import os

    try:  # the emulator's profile and PyTorch's OpInfo database both need torch
        from spyre_emu.errors import ProfileError
        from spyre_emu.profile import (
            DEFAULT_PROFILE_FILE,
            PROFILE_ENV,
            load_profile_file,
            profile_from_env,
        )
    except ImportError as exc:
        raise _fail(f"specs profile-check needs torch installed ({exc})") from None

    files = _spec_files(paths)
    if not files:
        raise _fail("no spec files found")
    try:
        load_specs(files)
    except SpecErrors as exc:
        _report_spec_errors(exc)
        raise _fail(f"{len(exc.errors)} error(s) in the spec; nothing was compared") from None
    from_env = os.environ.get(PROFILE_ENV, "").strip()
    try:
        if profile_file is not None:
            chosen, profile = str(profile_file), load_profile_file(profile_file)
        else:  # as the emulator reads it: unset or "default" is its bundled default
            chosen = from_env if from_env not in ("", "default") else str(DEFAULT_PROFILE_FILE)
            profile = profile_from_env()
    except ProfileError as exc:
        raise _fail(str(exc)) from None
    from spyre_emu.spec_parity import check_profile_parity

    with err.status(f"tracing the specs' ops against profile {profile.name!r}…"):
        report = check_profile_parity(files, profile, chosen)
    colour = {"error": "red", "warning": "yellow", "note": "dim"}
    for finding in report.findings:
        out.print(  # FILE:LINE:COL: severity: ..., as `specs check` prints its errors
            f"{escape(str(finding.location))}: [{colour[finding.severity]}]{finding.severity}[/]: "
            f"{escape(finding.message)}",
            soft_wrap=True,
        )
    warnings = sum(f.severity == "warning" for f in report.findings)
    summary = (
        f"{len(files)} spec file(s) against profile {profile.name!r} ({chosen}): "
        f"{len(report.traced)} op(s) and module(s) traced, {len(report.errors)} error(s), "
        f"{warnings} warning(s)"
    )
    if report.errors or (strict and warnings):
        err.print(f"[red]MISMATCH[/] {summary}", soft_wrap=True)
        raise typer.Exit(1)
    out.print(f"[green]OK[/] {summary}", soft_wrap=True)


@specs_app.command("profile-from")
def specs_profile_from(
    spec: Annotated[Path, typer.Argument(help="A spec file whose global block lists the card.")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the profile here instead of to stdout."),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="The profile's name (default: SPEC-published).")
    ] = None,
    origin: Annotated[
        str | None,
        typer.Option(help="Where the spec came from (repository@commit path), recorded."),
    ] = None,
) -> None:
    """Write a spyre-emu profile from a spec's global block (e.g. torch-spyre's published
    support list): its dtypes, every op but the families the card has no kernels for, and
    its force_xfail ops refused; the spec's name, sha256 and origin recorded in the file.

    Regenerates the bundled default: ``ci-relay specs profile-from
    .../upstream_tests_beta/nn-test_init.yaml --name torch-spyre-published --origin
    'torch-spyre/torch-spyre@COMMIT PATH' -o spyre_emu/default_profile.yaml``.
    """
    if spec.is_dir():
        raise _fail(f"{spec} is a folder: give the one spec file to take the profile from")
    try:
        load_specs([spec])
    except SpecErrors as exc:
        _report_spec_errors(exc)
        raise _fail(f"{len(exc.errors)} error(s) in the spec; no profile written") from None
    try:
        from spyre_emu.profile_from_spec import profile_from_spec
    except ImportError as exc:
        raise _fail(f"specs profile-from needs torch installed ({exc})") from None
    with err.status("resolving the spec's op names…"):
        try:
            generated = profile_from_spec(spec, name, origin)
        except ValueError as exc:
            raise _fail(str(exc)) from None
    for note in generated.notes:
        err.print(f"note: {note}", markup=False, soft_wrap=True)
    if output is None:
        typer.echo(generated.text, nl=False)
        return
    try:
        output.write_text(generated.text, encoding="utf-8")
    except OSError as exc:
        raise _fail(f"cannot write {output}: {exc.strerror}") from None
    err.print(f"wrote profile {generated.profile.name!r} to {output}", markup=False)


@specs_app.command("show")
def specs_show(
    specs: Annotated[list[Path], typer.Argument(help="Spec files or folders of them.")],
    upstream: UpstreamOpt = None,
    backend: BackendOpt = "cpu",
    label: LabelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List every test variant the spec covers, with its mode and why (collects, runs nothing)."""
    _check_label(label, specs)
    loaded, profile, root, _drift = _load_for_run(specs, upstream, backend)
    _check_backend(profile)
    spec_files = _spec_files(specs)
    with err.status("collecting upstream tests…"):
        result, decided = run_pytest(
            lambda ini: pytest_args(
                spec_files, loaded, root, profile, ini, label=label, collect_only=True
            ),
            root,
        )
    unreadable = [o for o in result.outcomes if o.outcome == "error"]  # files that did not import
    if unreadable and not decided:
        for problem in result.collection_errors:
            err.print(problem, markup=False)
        raise _fail("could not collect the upstream tests", 3)
    for failed in unreadable:
        err.print(f"[red]COLLECTION ERROR[/] {failed.nodeid}: {failed.message}", soft_wrap=True)
    _show(decided, profile.name, as_json)
    _print_input_generation(loaded, err if as_json else out)
    if unreadable:  # the listing is partial: say so in the exit code too
        raise _fail(
            f"{len(unreadable)} file(s) could not be collected; the other variants are listed", 1
        )


def _show(decided: list[Any], backend: str, as_json: bool) -> None:
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
    table = Table(title=f"{len(decided)} test variants on backend {backend}")
    table.add_column("test")
    table.add_column("mode")
    table.add_column("why", overflow="fold")
    for nodeid, _variant, decision in decided:
        table.add_row(nodeid, decision.mode.value, decision.reason)
    out.print(table)


@specs_app.command("suggest")
def specs_suggest(
    specs: Annotated[list[Path], typer.Argument(help="Spec files or folders of them.")],
    backend: BackendOpt = "cpu",
    repository: Annotated[
        str | None, typer.Option(help="Only runs of this upstream repository (owner/name).")
    ] = None,
    days: Annotated[int, typer.Option(min=1, help="Look at finished runs this recent.")] = 7,
    min_runs: Annotated[int, typer.Option(min=1, help="Fewer runs of a test prove nothing.")] = 3,
    flake_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of reruns that makes a test flaky.")
    ] = 0.2,
    flake_action: Annotated[
        str, typer.Option(help="What a flaky test gets: tag (tags: [flaky]) or skip.")
    ] = "tag",
    patch: Annotated[Path | None, typer.Option(help="Write the proposed patch here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Propose spec edits from the relay's stored results (never applied by itself).

    A test that failed in every finished run of the backend in the window becomes ``xfail``
    with its error; one that passed only on rerun often enough gets a tag (or ``skip``).
    Reads the relay's database (CI_RELAY_DATABASE_URL). Prints a patch that keeps the specs'
    comments; ``--patch`` writes it.
    """
    import difflib
    from datetime import UTC, datetime, timedelta

    from ci_relay.context import RelayContext
    from ci_relay.dashboard.suggestions import SuggestPolicy, edits_for, suggest
    from reuse_specs.spec_patch import PatchError, patch_spec_text

    if flake_action not in ("tag", "skip"):
        raise _fail(f"--flake-action {flake_action!r}: expected tag or skip")
    files = _spec_files(specs)
    if not files:
        raise _fail("no spec files found")
    try:
        loaded = load_specs(files)
    except SpecErrors as exc:
        _report_spec_errors(exc)
        raise _fail(f"{len(exc.errors)} error(s) in the spec") from None
    policy = SuggestPolicy(
        since=datetime.now(UTC) - timedelta(days=days),
        min_runs=min_runs,
        flake_rate=flake_rate,
        flake_action="skip" if flake_action == "skip" else "tag",
    )
    rt = RelayContext(_settings())
    rt.db.upgrade()  # a relay that has never run has no tables yet
    with rt.db.session() as session:
        found = suggest(session, backend, policy, repository)
    edits, uncovered = edits_for(found, loaded, policy)
    diffs: list[str] = []
    for spec in files:
        mine = [e for e in edits if e.spec == str(spec)]
        if not mine:
            continue
        before = spec.read_text(encoding="utf-8")
        try:
            after = patch_spec_text(before, mine)
        except PatchError as exc:
            uncovered.append(f"{spec}: {exc}")
            continue
        diffs.append(
            "".join(
                difflib.unified_diff(
                    before.splitlines(keepends=True),
                    after.splitlines(keepends=True),
                    f"a/{spec.name}",
                    f"b/{spec.name}",
                )
            )
        )
    text = "".join(diffs)
    if as_json:
        rows = [
            {"test": s.test, "action": s.action, "reason": s.reason, "runs": s.runs} for s in found
        ]
        print(json.dumps({"suggestions": rows, "uncovered": uncovered, "patch": text}, indent=2))
    else:
        if not found:
            out.print(f"no suggestion: no test of {backend} failed on every run or flaked")
        for item in found:
            out.print(f"{item.action:>5}  {item.test}: {item.reason}", markup=False, soft_wrap=True)
        for line in uncovered:
            out.print(f"[yellow]not in the patch:[/] {line}", soft_wrap=True)
        if text:
            out.print(text, markup=False, highlight=False, end="")
    if patch is not None:
        patch.parent.mkdir(parents=True, exist_ok=True)
        patch.write_text(text, encoding="utf-8")
        err.print(f"patch written to {patch}")
