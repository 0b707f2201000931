"""``ci-relay images build``: the runner (and relay) container images, built locally."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ci_relay.cli.common import (
    _backend,
    _fail,
    _policy_backends,
    out,
)
from ci_relay.cli.follow import follow_steps
from reuse_specs.backends import backends_dirs

images_app = typer.Typer(help="Test-runner container images.", no_args_is_help=True)


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
    services: Annotated[
        bool,
        typer.Option(
            "--services",
            help="Also build the compose stack's Redis and PostgreSQL from Debian's packages "
            "(docker/compose.local.yaml uses them; no registry needed).",
        ),
    ] = False,
    refresh: Annotated[
        bool,
        typer.Option(
            "--refresh",
            help="Resolve and fetch the wheels again even when the checkout is unchanged "
            "(newer releases within the pinned ranges); the image is rebuilt only if they differ.",
        ),
    ] = False,
) -> None:
    """Build images offline (debootstrap base, local wheelhouse); reuses what exists.

    A runner image follows its backend's declaration (bundled, or in the folder of
    CI_RELAY_BACKENDS_DIR or of the policy file's backends_dir), rendered from the one
    template docker/runner.Containerfile."""
    policy_backends = _policy_backends()  # also registers the policy's backends_dir
    backends = backend or policy_backends or ["cpu"]
    for name in backends:
        _backend(name)  # unknown, or its declaration is wrong: refused before any build
    root = Path(__file__).resolve().parents[2]  # ci_relay/cli/main.py -> the checkout
    if not (root / "pyproject.toml").is_file() or not (root / "docker").is_dir():
        raise _fail(f"{root} is not a ci-relay source checkout (images build from one)")
    script = root / "ci_relay" / "execution" / "build_images.sh"
    targets = [f"runner-{b}" for b in backends] + (["relay"] if relay else [])
    targets += ["redis", "postgres"] if services else []
    flags = ["--refresh"] if refresh else []
    # the script finds declarations where the registry does (settings, the policy's folder)
    flags += [arg for d in backends_dirs() for arg in ("--backends-dir", str(d))]
    if follow_steps(["bash", str(script), str(root), *flags, *targets], "images build"):
        raise _fail("image build failed (see the messages above)", 1)
    from ci_relay.source_digest import TAG_PREFIX, source_digest

    tag = TAG_PREFIX + source_digest(root)  # what workers running these sources ask for
    ready = ", ".join(f"localhost/ci-relay-{t}:{tag}" for t in targets)
    out.print(f"image(s) ready: {ready} (also tagged :latest)")
