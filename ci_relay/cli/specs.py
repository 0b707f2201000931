"""``ci-relay specs check|show``: validate reuse specs and see what they select."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ci_relay.cli.common import (
    BackendOpt,
    LabelOpt,
    UpstreamOpt,
    _check_backend,
    _fail,
    _load_for_run,
    _report_spec_errors,
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
from reuse_specs.upstream_check import check_against_upstream

specs_app = typer.Typer(help="Validate and inspect reuse specs.", no_args_is_help=True)


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
