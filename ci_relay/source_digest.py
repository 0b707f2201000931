"""Which ci-relay sources a runner image was built from, and which this process runs.

A container shard runs the ci-relay code inside the runner image, not the worker's. If the
two differ (the code changed and nobody ran ``ci-relay images build``), shards would silently
run old code. So images are tagged ``src-<digest>`` with the digest of the sources they were
built from, and a worker asks for the tag of its own sources: a missing tag is a clear error.

The digest covers what the image installs and runs: the Python modules and the YAML/JSON data
of the four packages (``__pycache__`` and the sample upstream's commit data left out), read
the same way from a checkout (``images build``) and from an installed wheel (a worker in the
relay image), so the two agree whenever the sources do. Kept free of heavy imports: the image
build script runs it with only the checkout on ``sys.path``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

PACKAGES = ("ci_relay", "reuse_specs", "spyre_emu", "test_selection")
SUFFIXES = frozenset({".py", ".yaml", ".json"})
SKIPPED = ("__pycache__", "ci_relay/sample_upstream/commits/")
TAG_PREFIX = "src-"


def _digest(root: Path, keep: Callable[[str], bool]) -> str:
    """16 hex digits over the path and bytes of every package file below ``root`` whose
    relative path ``keep`` accepts (compiled files never count)."""
    digest = hashlib.sha256()
    files = sorted(
        path
        for package in PACKAGES
        for path in (root / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )
    for path in files:
        relative = path.relative_to(root).as_posix()
        if keep(relative):
            digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _is_source(relative: str) -> bool:
    return Path(relative).suffix in SUFFIXES and not any(skip in relative for skip in SKIPPED)


def source_digest(root: Path) -> str:
    """The digest of every source file below ``root`` (the folder that holds the packages: a
    checkout, or site-packages)."""
    return _digest(root, _is_source)


def input_digest(root: Path) -> str:
    """The digest of everything an image build reads from a checkout: every file of the
    packages (templates, scripts and sample data too, not only what ``source_digest`` covers)
    and ``pyproject.toml`` (dependency ranges, package data). ``images build`` reuses an image
    built from the same inputs without resolving its wheels again (that takes half a minute)."""
    pyproject = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    files = _digest(root, lambda _relative: True)
    return hashlib.sha256(f"{pyproject}\0{files}".encode()).hexdigest()[:16]


@functools.cache
def own_image_tag() -> str:
    """The image tag of the sources this process runs (computed once per process)."""
    return TAG_PREFIX + source_digest(Path(__file__).resolve().parent.parent)


if __name__ == "__main__":  # the build script: python -m ci_relay.source_digest [--inputs] ROOT
    import sys

    if sys.argv[1] == "--inputs":
        print(input_digest(Path(sys.argv[2])))
    else:
        print(TAG_PREFIX + source_digest(Path(sys.argv[1])))
