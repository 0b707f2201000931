"""A backend's runner image from its declaration: the Containerfile rendered from the one
template (``docker/runner.Containerfile``) and what the build script needs to know.

Run by ``build_images.sh`` with only the checkout on ``sys.path`` and the system's Python
(PyYAML, no pydantic), so it reads the declaration as plain YAML: ``ci-relay images build``
has validated it (:func:`reuse_specs.backends.load_declaration`) before the script starts.

    python3 -m ci_relay.execution.runner_image ROOT NAME OUTDIR [--backends-dir DIR ...]

writes OUTDIR/Containerfile and OUTDIR/refusal (what to say when a required input is not
given) and prints shell assignments: ``from_backend``, ``base_image`` and ``wheels`` (``${VAR}``
left for the script, which alone reads the environment), ``debian``, ``requires`` (the
variables the build needs). Exits 2 with the reason on stderr for an unknown backend.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

TEMPLATE = Path("docker") / "runner.Containerfile"
BUNDLED = Path("reuse_specs") / "backend_declarations"
_BLOCK = re.compile(r"^#@ (\w+)\n(.*?)^#@ end\n", re.MULTILINE | re.DOTALL)


class ImageRefused(Exception):
    """Why this image cannot be built here (printed as the build's refusal)."""


def declarations(root: Path, folders: list[Path]) -> dict[str, Path]:
    """Every declaration by name: the bundled ones, then those of ``folders``."""
    found: dict[str, Path] = {}
    for folder in [root / BUNDLED, *folders]:
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix in (".yaml", ".yml") and path.is_file():
                data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
                if isinstance(data, dict) and isinstance(data.get("name"), str):
                    found.setdefault(data["name"], path)
    return found


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
    rest = argv[3:]
    folders = [Path(rest[i + 1]) for i in range(len(rest) - 1) if rest[i] == "--backends-dir"]
    found = declarations(root, folders)
    if name not in found:
        print(f"images: unknown backend {name} (known: {' '.join(sorted(found))})", file=sys.stderr)
        return 2
    path = found[name]
    image: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")).get("image") or {}
    requires = image.get("requires") or {}
    needed: dict[str, str] = requires.get("env") or {}
    wheels = str(image.get("wheels") or "")
    if wheels and not wheels.startswith("${"):
        wheels = str((path.parent / wheels).resolve())
    outdir.mkdir(parents=True, exist_ok=True)
    template = (root / TEMPLATE).read_text(encoding="utf-8")
    (outdir / "Containerfile").write_text(render(template, name, image), encoding="utf-8")
    refusal = [f"runner-{name} needs {requires.get('what', 'inputs that are not given')}:"]
    refusal += [f"  {key} = {what}" for key, what in needed.items()]
    (outdir / "refusal").write_text("\n".join(refusal) + "\n", encoding="utf-8")
    assignments = {
        "from_backend": str(image.get("from_backend") or ""),
        "base_image": str(image.get("base_image") or ""),
        "wheels": wheels,
        "debian": ",".join(str(p) for p in image.get("debian_packages") or []),
        "requires": " ".join(needed),
    }
    for key, value in assignments.items():
        print(f"{key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
