"""``ci-relay backends list|check|schema``: the declared backends, checking a declaration
before it is used, and the declaration format's JSON Schema for editors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ci_relay.cli.common import _emit_schema, _fail, _register_backends, _report_spec_errors, out
from reuse_specs.backends import (
    BACKENDS,
    BACKENDS_DIR_ENV,
    DeclarationErrors,
    add_backends_dir,
    remove_backends_dir,
)

backends_app = typer.Typer(
    help=f"Backends: bundled, or declared in YAML (a folder of ${BACKENDS_DIR_ENV}).",
    no_args_is_help=True,
)


@backends_app.command("list")
def backends_list() -> None:
    """Every backend this relay knows, with where it is declared."""
    _register_backends()
    try:
        backends = sorted(BACKENDS.values(), key=lambda b: b.name)
    except DeclarationErrors as exc:
        _report_spec_errors(exc)
        raise _fail(f"{len(exc.errors)} error(s) in the backend declarations") from None
    table = Table(title=f"{len(backends)} backends")
    for column in ("name", "device type", "per device", "declared in", "description"):
        table.add_column(column)
    for b in backends:
        where = "bundled" if b.bundled else str(b.declaration)
        per_device = str(b.processes_per_device or "-")
        table.add_row(b.name, b.device_type, per_device, where, b.description)
    out.print(table)


@backends_app.command("check")
def backends_check(
    folders: Annotated[
        list[Path], typer.Argument(help="Folders of declarations, as CI_RELAY_BACKENDS_DIR.")
    ],
) -> None:
    """Validate folders of declarations with the bundled ones: every problem, file:line:col."""
    for folder in folders:
        add_backends_dir(folder)
    try:
        names = sorted(BACKENDS)
    except DeclarationErrors as exc:
        _report_spec_errors(exc)
        raise _fail(f"{len(exc.errors)} error(s) in the backend declarations") from None
    finally:
        for folder in folders:
            remove_backends_dir(folder)
    out.print(f"[green]OK[/] {len(names)} backends: {', '.join(names)}")


@backends_app.command("schema")
def backends_schema(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the schema here instead of to stdout."),
    ] = None,
) -> None:
    """Print the JSON Schema of a backend declaration, for editors.

    Generated from the models declarations are validated with; the bundled declarations name
    the shipped copy (reuse_specs/backend.schema.json) on their first line.
    """
    from reuse_specs.backend_schema import backend_json_schema

    _emit_schema(backend_json_schema(), output, "backend")
