"""``python -m ci_relay`` is the ``ci-relay`` command."""

from ci_relay.cli import app

app(prog_name="ci-relay")
