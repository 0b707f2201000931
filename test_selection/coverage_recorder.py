"""The coverage recorder's plugin name, kept: ``-p test_selection.coverage_recorder``.

Shards, runner images and ``coverage record`` load the recorder by this name, so it stays
importable after the recorder moved to :mod:`test_selection.coverage.recorder`. Only the
two pytest hooks are re-exported: pytest registers what this module holds.
"""

from test_selection.coverage.recorder import pytest_addoption, pytest_configure

__all__ = ["pytest_addoption", "pytest_configure"]
