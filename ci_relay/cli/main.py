"""The ``ci-relay`` application: one Typer app, its commands grouped one module each."""

from __future__ import annotations

import typer

from ci_relay.cli import backends, coverage, images, rerun, run, service, specs, upgrade
from ci_relay.cli import report as report_commands
from ci_relay.cli import select as select_commands

app = typer.Typer(
    help="Run the upstream PyTorch tests that matter for an out-of-tree backend.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(specs.specs_app, name="specs")
select_commands.register(app)
report_commands.register(app)
app.add_typer(run.commands)
app.add_typer(images.images_app, name="images")
app.add_typer(backends.backends_app, name="backends")
app.add_typer(coverage.coverage_app, name="coverage")
app.add_typer(service.commands)
app.add_typer(upgrade.commands)
app.add_typer(rerun.commands)
