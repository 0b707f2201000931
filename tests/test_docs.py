"""The docs say what the product does: every command, option and setting the code has is named
in README.md or docs/, every ``CI_RELAY_*`` name the docs give is read by something in the
repository, every relative link lands on a file (and a heading, for ``#anchor``), and the README
stays a short front page with the quick start's two commands (issue 46)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from ci_relay.cli.main import app
from ci_relay.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
QUICK_START = ("bash scripts/demo.sh", "bash scripts/test.sh")
README_MAX_LINES = 200
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _docs() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in PAGES)


def _named(name: str, text: str) -> bool:
    """``name`` appears as a whole word (``--rev`` is not named by ``--revision``)."""
    return re.search(re.escape(name) + r"(?![\w-])", text) is not None


def _commands(command: Any, path: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    """Every leaf command of the real CLI (typer builds on its own copy of click's classes,
    so groups are told by their ``commands``)."""
    if hasattr(command, "commands"):
        for name, sub in sorted(command.commands.items()):
            if not sub.hidden:
                yield from _commands(sub, (*path, name))
    else:
        yield " ".join(("ci-relay", *path)), command


def _settings_names() -> set[str]:
    names = set()
    prefix = Settings.model_config.get("env_prefix", "")
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        if alias is None:
            names.add(f"{prefix}{field}".upper())
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.update(str(choice).upper() for choice in alias.choices)
    return {n for n in names if n.startswith("CI_RELAY_")}


def test_every_command_and_option_is_documented() -> None:
    docs = _docs()
    commands = list(_commands(typer.main.get_command(app), ()))
    assert len(commands) > 20  # the walk found the real command tree
    missing = [name for name, _ in commands if name not in docs]
    options = [
        f"{name} {opt}"
        for name, command in commands
        for param in command.params
        if type(param).__name__.endswith("Option") and not getattr(param, "hidden", False)
        for opt in param.opts
        if opt.startswith("--") and opt != "--help" and not _named(opt, docs)
    ]
    assert not missing, f"commands no page names: {missing}"
    assert not options, f"options no page names: {options}"


def test_every_setting_is_documented() -> None:
    docs = _docs()
    names = _settings_names()
    assert len(names) > 40
    assert not sorted(n for n in names if not _named(n, docs))


def test_every_ci_relay_name_the_docs_give_is_read_by_something() -> None:
    """A setting the docs name must exist: in the settings, or read by a script, the compose
    files or the test runner (the tracked files outside the docs)."""
    settings = _settings_names()
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    elsewhere = "\n".join(
        (ROOT / f).read_text(encoding="utf-8", errors="replace")
        for f in tracked
        if not f.endswith(".md") and not f.startswith("tests/data/") and (ROOT / f).is_file()
    )
    named = set(re.findall(r"CI_RELAY_[A-Z0-9_]*[A-Z0-9]", _docs()))
    unknown = sorted(n for n in named - settings if not _named(n, elsewhere))
    assert not unknown, f"named in the docs, read by nothing: {unknown}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_slug_follows_githubs_rules() -> None:
    assert _slug("Coverage maps (issue 34): what `was` measured") == (
        "coverage-maps-issue-34-what-was-measured"
    )


def test_the_readme_is_a_short_front_page_with_the_quick_start() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count("\n") <= README_MAX_LINES
    for command in QUICK_START:
        assert re.search(rf"^{re.escape(command)}\s", readme, flags=re.M), command
    for page in PAGES[1:]:  # the front page leads to every page
        assert f"docs/{page.name}" in readme, page.name
