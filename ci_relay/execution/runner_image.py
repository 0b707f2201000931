"""A backend's runner image from its declaration: the Containerfile rendered from the one
template (``docker/runner.Containerfile``) and what the build script needs to know.

Run by ``build_images.sh`` with only the checkout on ``sys.path`` and the system's Python
(PyYAML, no pydantic), so it reads the declaration as plain YAML: ``ci-relay images build``
has validated it (:func:`reuse_specs.backends.load_declaration`) before the script starts.

    python3 -m ci_relay.execution.runner_image ROOT NAME OUTDIR

writes OUTDIR/Containerfile and prints shell assignments (``from_backend``, ``base_image``,
``wheels``, ``debian``); exits 2 with the reason on stderr when the image cannot be built
(an unknown backend, inputs the declaration requires that are not given).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

BACKENDS_DIR_ENV = "CI_RELAY_BACKENDS_DIR"  # as reuse_specs.backends (not imported: pydantic)
TEMPLATE = Path("docker") / "runner.Containerfile"
BUNDLED = Path("reuse_specs") / "backend_declarations"
_TOKEN = re.compile(r"\$\{(\w+)\}")
_BLOCK = re.compile(r"^#@ (\w+)\n(.*?)^#@ end\n", re.MULTILINE | re.DOTALL)


class ImageRefused(Exception):
    """Why this image cannot be built here (printed as the build's refusal)."""


def declarations(root: Path) -> dict[str, Path]:
    """Every declaration by name: the bundled ones, then those of ``CI_RELAY_BACKENDS_DIR``."""
    folders = [root / BUNDLED]
    folders += [Path(p) for p in os.environ.get(BACKENDS_DIR_ENV, "").split(os.pathsep) if p]
    found: dict[str, Path] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix in (".yaml", ".yml") and path.is_file():
                data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
                if isinstance(data, dict) and isinstance(data.get("name"), str):
                    found.setdefault(data["name"], path)
    return found


def _expand(value: str, allowed: dict[str, str]) -> str:
    return _TOKEN.sub(lambda m: os.environ[m.group(1)] if m.group(1) in allowed else "", value)


def plan(root: Path, name: str) -> tuple[dict[str, Any], Path]:
    """The declaration's image section and the declaration's path, or :class:`ImageRefused`."""
    found = declarations(root)
    if name not in found:
        raise ImageRefused(f"unknown backend {name} (known: {' '.join(sorted(found))})")
    path = found[name]
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    image: dict[str, Any] = data.get("image") or {}
    requires = image.get("requires") or {}
    needed = requires.get("env") or {}
    if any(not os.environ.get(key) for key in needed):
        lines = [f"runner-{name} needs {requires.get('what', 'inputs that are not given')}:"]
        lines += [f"  {key} = {what}" for key, what in needed.items()]
        raise ImageRefused("\n".join(lines))
    return image, path


def render(template: str, name: str, image: dict[str, Any]) -> str:
    """The Containerfile: the template's blocks that apply, its @WORD@ filled in."""
    packages = [str(p) for p in image.get("packages") or []]
    applies = {
        "fresh": not image.get("from_backend"),
        "extend": bool(image.get("from_backend")) and bool(packages),
        "env": bool(image.get("env")),
        "check": bool(image.get("check")),
    }
    text = _BLOCK.sub(lambda m: m.group(2) if applies.get(m.group(1)) else "", template)
    env = " \\\n    ".join(f"{k}={json.dumps(str(v))}" for k, v in (image.get("env") or {}).items())
    fills = {
        "@PACKAGES@": " ".join(shlex.quote(p) for p in packages),
        "@ENV@": env,
        "@CHECK@": json.dumps(str(image.get("check") or "")),
        "@NAME@": name,
    }
    for word, value in fills.items():
        text = text.replace(word, value)
    return text


def main(argv: list[str]) -> int:
    root, name, outdir = Path(argv[0]), argv[1], Path(argv[2])
    try:
        image, path = plan(root, name)
        allowed = ((image.get("requires") or {}).get("env")) or {}
        wheels = _expand(str(image.get("wheels") or ""), allowed)
        if wheels:
            folder = (path.parent / wheels).resolve()
            if not folder.is_dir():
                raise ImageRefused(f"runner-{name}: no wheels folder {folder} ({path})")
            wheels = str(folder)
    except ImageRefused as exc:
        for line in str(exc).splitlines():
            print(f"images: {line}", file=sys.stderr)
        return 2
    outdir.mkdir(parents=True, exist_ok=True)
    template = (root / TEMPLATE).read_text(encoding="utf-8")
    (outdir / "Containerfile").write_text(render(template, name, image), encoding="utf-8")
    assignments = {
        "from_backend": str(image.get("from_backend") or ""),
        "base_image": _expand(str(image.get("base_image") or ""), allowed),
        "wheels": wheels,
        "debian": ",".join(str(p) for p in image.get("debian_packages") or []),
    }
    for key, value in assignments.items():
        print(f"{key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
