"""``ci-relay upgrade``: from one upstream release to the next, the tests that changed and the
spec edits that follow. The work is in :mod:`test_selection.upgrade.spec_impact`; this is the
command line (tables, the patch, writing files only when asked)."""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ci_relay.cli.common import (
    BackendOpt,
    UpstreamOpt,
    _fail,
    _settings,
    _spec_files,
    _upstream_dir,
    err,
    out,
    post_to_relay,
)

if TYPE_CHECKING:
    from reuse_specs.loader import LoadedSpec
    from test_selection.upgrade.spec_impact import UpgradePlan

commands = typer.Typer()

SHOWN = 20  # lines of a long list shown in the terminal; --json and the files have them all


@commands.command("upgrade")
def upgrade(
    base: Annotated[str, typer.Option("--from", help="The revision the specs are green at.")],
    head: Annotated[str, typer.Option("--to", help="The revision to move to.")],
    spec: Annotated[
        list[Path] | None, typer.Option("--spec", help="Spec file or folder; repeatable.")
    ] = None,
    upstream: UpstreamOpt = None,
    backend: BackendOpt = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    patch: Annotated[
        Path | None, typer.Option("--patch", help="Write the proposed spec patch here.")
    ] = None,
    apply: Annotated[
        bool, typer.Option("--apply", help="Write the patched specs (only when they check).")
    ] = False,
    run_list: Annotated[
        Path | None,
        typer.Option("--run-list", help="Write what changed here, in `run --tests` format."),
    ] = None,
    submit: Annotated[
        str | None,
        typer.Option(
            "--submit",
            help="Instead of planning here, ask this relay (its URL) to run the changed tests "
            "at A and at B; needs --repository and CI_RELAY_DISPATCH_TOKEN.",
        ),
    ] = None,
    repository: Annotated[
        str | None, typer.Option(help="With --submit: the upstream repository (owner/name).")
    ] = None,
    variants: Annotated[
        bool,
        typer.Option(
            "--variants",
            help="Also count test variants (devices, dtypes, ops) by collecting B's tests with "
            "pytest in this process, as `specs show` does: it imports B's test files.",
        ),
    ] = False,
) -> None:
    """Diff the specs' tests between two upstream revisions; propose the spec edits.

    Prints the changed tests with their evidence, "N of M tests need a run", the spec impact
    (listed names that vanished, with their renames; new tests that will follow
    unlisted_test_mode; ops that vanished) and a patch that keeps the specs' comments and
    formatting. Exit 0 when the specs need no edit or the patch checks at B, 1 when some
    drift needs a person, 2 on bad input. Nothing is written without --patch, --apply or
    --run-list.
    """
    from test_selection.upgrade.spec_impact import UpgradeError, plan_upgrade

    root = _upstream_dir(upstream)
    if not (root / ".git").exists() and not (root / "HEAD").is_file():
        raise _fail(f"upstream {root} is not a git repository (the upgrade compares commits)")
    if submit is not None:
        _submit(submit, repository, root, base, head, backend)
        return
    files = _spec_files(spec or [])
    if not files:
        raise _fail("no spec files found (pass --spec FILE or a folder of them)")
    try:
        with err.status(f"comparing {base} and {head}…"):
            plan = plan_upgrade(root, base, head, files, backend)
    except UpgradeError as exc:
        raise _fail(str(exc)) from None
    counted = _count_variants(root, plan, files, backend) if variants else None
    if as_json:
        print(json.dumps({**plan.to_json(), "variants": counted}, indent=2))
    else:
        _print(plan)
        if counted is not None:
            _print_variants(counted)
    if run_list is not None:
        _write(run_list, "".join(f"{line}\n" for line in plan.diff.run_list()))
        err.print(f"run list: {len(plan.diff.run_list())} test(s) written to {run_list}")
    patch_text = plan.unified_diff()
    if patch is not None:
        _write(patch, patch_text)
        err.print(f"patch written to {patch}" if patch_text else f"no spec edit: {patch} empty")
    if apply:
        if plan.patch_problems:
            raise _fail("the patch was not applied: " + "; ".join(plan.patch_problems), 1)
        changed = [p for p in plan.patches if p.before != p.after]
        for item in changed:
            _write(item.path, item.after)
        err.print(f"applied: {len(changed)} spec file(s) rewritten" if changed else "no edit")
    if plan.patch_problems or plan.impact.unresolved:
        raise typer.Exit(1)


def _submit(
    relay: str, repository: str | None, root: Path, base: str, head: str, backend: str
) -> None:
    """POST the upgrade to a relay, with both revisions resolved to commit ids here."""
    from test_selection.git import GitError, Repo

    secret = _settings().dispatch_token
    token = secret.get_secret_value() if secret else ""
    if not token:
        raise _fail("--submit needs the relay's dispatch token in CI_RELAY_DISPATCH_TOKEN")
    if not repository:
        raise _fail("--submit needs --repository owner/name (as the relay's policy names it)")
    try:
        repo = Repo(root)
        body = {
            "repository": repository,
            "base": repo.resolve(base),
            "head": repo.resolve(head),
            "backends": [backend],
        }
    except GitError as exc:
        raise _fail(str(exc)) from None
    got = post_to_relay(relay.rstrip("/") + "/api/upgrades", token, body, "upgrade")
    out.print(f"upgrade {got['id']} submitted: {relay.rstrip('/')}{got['url']}")


def _count_variants(
    root: Path, plan: UpgradePlan, specs: list[Path], backend: str
) -> dict[str, dict[str, int]]:
    """Per file (and ``total``): the variants B collects under the specs, and how many of
    them belong to a changed test (for an ``@ops`` test changed only through the op
    database, only the variants of those ops)."""
    from ci_relay.execution.spec_run import pytest_args, run_pytest
    from reuse_specs.backends import get_backend
    from test_selection.git import Repo
    from test_selection.upgrade.spec_impact import exported_tree

    changed = {c.test: set(c.ops) for c in plan.diff.needing_run()}
    counts: dict[str, dict[str, int]] = {"total": {"variants": 0, "need_run": 0}}
    profile = get_backend(backend)
    with exported_tree(Repo(root), plan.diff.head) as tree:
        loaded = _loaded_at(specs, tree, backend)
        with err.status("collecting B's test variants…"):
            result, decided = run_pytest(
                lambda ini: pytest_args(specs, loaded, tree, profile, ini, collect_only=True),
                tree,
            )
        if result.collection_errors:
            for problem in result.collection_errors:
                err.print(problem, markup=False)
            raise _fail("could not collect B's tests for --variants", 3)
        for _nodeid, variant, _decision in decided:
            file = variant.file.relative_to(tree).as_posix()
            generic = "::".join(p for p in (file, variant.class_name, variant.test_name) if p)
            ops = changed.get(generic)
            need = ops is not None and (not ops or (variant.op or "") in ops)
            for key in (file, "total"):
                row = counts.setdefault(key, {"variants": 0, "need_run": 0})
                row["variants"] += 1
                row["need_run"] += int(need)
    return counts


def _loaded_at(specs: list[Path], tree: Path, backend: str) -> LoadedSpec:
    from reuse_specs.errors import SpecErrors
    from reuse_specs.loader import load_specs

    try:
        return load_specs(specs, tree, backend)
    except SpecErrors as exc:
        raise _fail(f"the specs do not load at B: {exc}") from None


def _print_variants(counts: dict[str, dict[str, int]]) -> None:
    total = counts["total"]
    out.print(f"[bold]{total['need_run']} of {total['variants']} test variants need a run[/]")
    for file, row in sorted(counts.items()):
        if file != "total":
            out.print(f"  {row['need_run']:>6} of {row['variants']:>6}  {file}", markup=False)


def _write(path: Path, text: str) -> None:
    """All or nothing: a temporary file beside the target, then an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        if path.exists():
            os.chmod(temp, path.stat().st_mode & 0o777)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _print(plan: UpgradePlan) -> None:
    diff = plan.diff
    kinds = diff.by_kind()
    need = len(diff.needing_run())
    out.print(
        f"[bold]{diff.base[:12]}..{diff.head[:12]}[/]: {diff.commits} commit(s), "
        f"{diff.files_changed} file(s) changed"
    )
    out.print(
        f"[bold]{need} of {diff.tests_at_head} tests need a run[/] "
        f"({', '.join(f'{k} {kinds[k]}' for k in kinds if k != 'removed')}); "
        f"{kinds['removed']} removed"
    )
    per_file: dict[str, Counter[str]] = {}
    for change in diff.changes:
        per_file.setdefault(change.test.split("::")[0], Counter())[change.kind] += 1
    if per_file:
        table = Table(title="changed tests per file")
        table.add_column("file")
        for kind in kinds:
            table.add_column(kind, justify="right")
        for file, counts in sorted(per_file.items()):
            table.add_row(file, *(str(counts[k] or "") for k in kinds))
        out.print(table)
    reasons = Counter(
        _reason_group(e) for c in diff.changes if c.kind == "dependencies" for e in c.evidence
    )
    for reason, count in reasons.most_common(8):
        out.print(f"  {count:>5}  dependencies: {reason}", markup=False)
    for change in diff.changes[:SHOWN]:
        was = f" (was {change.was})" if change.was else ""
        out.print(f"{change.kind:>12}  {change.test}{was}: {change.evidence[0]}", markup=False)
    if len(diff.changes) > SHOWN:
        out.print(f"… {len(diff.changes) - SHOWN} more (--json or --run-list for all)")
    for note in diff.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    _print_impact(plan)


def _reason_group(evidence: str) -> str:
    """Evidence with the specific name cut off, so like reasons count together."""
    if evidence.startswith("uses "):
        return "a helper it uses changed"
    if evidence.startswith("@ops test"):
        return "OpInfo entries of its ops changed"
    if evidence.startswith("base class"):
        return "a base class changed"
    if evidence.startswith("class "):
        return "its class's bases, decorators or attributes changed"
    return "a fixture or method of its class changed"


def _print_impact(plan: UpgradePlan) -> None:
    impact, diff = plan.impact, plan.diff
    out.print("[bold]spec impact[/]")
    if not impact.drift:
        out.print("  every name and path the specs list exists at B")
    for drift in impact.drift:
        out.print(f"  drift: {drift}", markup=False, soft_wrap=True)
    for edit in impact.edits:
        what = f"{edit.old} -> {edit.new}" if edit.new else f"drop {edit.old}"
        out.print(f"  edit: {what} ({edit.reason})", markup=False, soft_wrap=True)
    for line in impact.unresolved:
        out.print(f"  [yellow]needs a person:[/] {line}", soft_wrap=True)
    if impact.new_tests:
        modes = Counter(t.mode for t in impact.new_tests)
        out.print(
            f"  {len(impact.new_tests)} new test(s) no spec lists will follow unlisted_test_mode: "
            + ", ".join(f"{n} as {m}" for m, n in modes.items())
        )
        for test in impact.new_tests[:SHOWN]:
            out.print(f"    {test.test} ({test.mode})", markup=False)
    if diff.ops_added or diff.ops_removed:
        out.print(
            f"  ops appeared: {', '.join(diff.ops_added) or '-'}; "
            f"vanished: {', '.join(diff.ops_removed) or '-'}",
            markup=False,
        )
    for op in impact.ops_vanished_but_listed:
        out.print(f"  [yellow]supported_ops lists {op}, which B no longer defines[/]")
    patch_text = plan.unified_diff()
    if patch_text:
        out.print(
            "[bold]proposed patch[/]" + (" (does not check at B)" if plan.patch_problems else "")
        )
        out.print(patch_text, markup=False, highlight=False, end="")
    for problem in plan.patch_problems:
        out.print(f"  [red]patch problem:[/] {problem}", soft_wrap=True)
