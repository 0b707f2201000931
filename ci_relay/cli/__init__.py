"""The ``ci-relay`` command line: one module per command group.

``main`` holds the application and the relay's own commands (serve, worker, run, images,
demo, replay, ...); ``select`` the selector's (``select``, ``select-eval``); ``report`` the
GitHub Actions side of CRCR (``report crcr``, ``dispatch-info``).
"""

from ci_relay.cli.main import app

__all__ = ["app"]
