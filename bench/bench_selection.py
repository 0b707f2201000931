"""Selector speed on a generated upstream of 1,500 test files and 60,000 test functions.

Prints cold and warm inventory builds (goal: cold < 60 s), cold and warm
selection of one change (goal: warm < 2 s), each next to a baseline measured
in the same run: ``ast.parse`` of the same files, the floor any AST inventory
pays. Then ``select-eval`` figures on the sample upstream.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ci_relay.sample_upstream import build_sample_upstream
from test_selection import inventory as inventory_module
from test_selection.git import Repo
from test_selection.inventory import build_inventory
from test_selection.selector import SelectorConfig, select
from test_selection.types import Budget

FILES = 1500
CLASSES = 4
TESTS_PER_CLASS = 10
OPS = ["add", "mul", "sub", "div", "pow", "exp", "log", "sin", "cos", "tanh", "relu", "gelu"]
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@x.invalid",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@x.invalid",
}


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, env=GIT_ENV, check=True, capture_output=True)


def _test_file(i: int) -> str:
    lines = ["import torch", "from torch.testing._internal.common_utils import TestCase", ""]
    for c in range(CLASSES):
        lines.append(f"class TestArea{i}Part{c}(TestCase):")
        for t in range(TESTS_PER_CLASS):
            op = OPS[(i + c + t) % len(OPS)]
            lines += [
                f"    def test_{op}_case_{t}(self, device='cpu'):",
                "        x = torch.ones(3, device=device)",
                f"        y = torch.{op}(x) if hasattr(torch, '{op}') else x",
                "        self.assertEqual(y.shape, x.shape)",
                "",
            ]
    return "\n".join(lines)


def _make_upstream(root: Path) -> tuple[str, str]:
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    for i in range(FILES):
        path = root / "test" / f"area{i // 100}" / f"test_area_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_test_file(i))
    (root / "torch").mkdir()
    (root / "torch" / "ops.py").write_text("".join(f"def {op}(x):\n    return x\n\n" for op in OPS))
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    base = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    (root / "torch" / "ops.py").write_text(
        "".join(f"def {op}(x):\n    return x{' * 2' if op == 'gelu' else ''}\n\n" for op in OPS)
    )
    _git(root, "commit", "-qam", "change gelu")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    return base, head


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-select-") as tmp:
        work = Path(tmp)
        root = work / "upstream"
        t0 = time.perf_counter()
        base, head = _make_upstream(root)
        print(
            f"generated {FILES} test files, {FILES * CLASSES * TESTS_PER_CLASS} test functions "
            f"in {time.perf_counter() - t0:.1f}s"
        )

        start = time.perf_counter()
        for path in sorted(root.glob("test/**/test_*.py")):
            ast.parse(path.read_bytes())
        floor = time.perf_counter() - start

        repo = Repo(root)
        cache = work / "cache"
        start = time.perf_counter()
        inventory = build_inventory(repo, head, cache_dir=cache)
        cold = time.perf_counter() - start
        inventory_module._MEMORY.clear()  # warm from the disk cache, as a new process sees it
        start = time.perf_counter()
        build_inventory(repo, head, cache_dir=cache)
        warm = time.perf_counter() - start
        print(
            f"ast.parse baseline {floor:.2f}s; inventory cold {cold:.2f}s ({cold / floor:.1f}x), "
            f"warm {warm:.2f}s ({warm / floor:.2f}x); {len(inventory.tests())} tests "
            "(goal: cold < 60 s)"
        )

        config = SelectorConfig(budget=Budget.parse("15%"), cache_dir=work / "cache2")
        start = time.perf_counter()
        plan, _ = select(root, base, head, None, config)
        cold_sel = time.perf_counter() - start
        start = time.perf_counter()
        plan, _ = select(root, base, head, None, config)
        warm_sel = time.perf_counter() - start
        print(
            f"selection cold {cold_sel:.2f}s, warm {warm_sel:.2f}s "
            f"({warm_sel / floor:.2f}x the parse "
            f"baseline); {len(plan.selected)} of {plan.universe_size} selected (goal: warm < 2 s)"
        )

        sample = build_sample_upstream(work / "sample")
        for agent in ("none", "local"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ci_relay",
                    "select-eval",
                    "--upstream",
                    str(sample.path),
                    "--commits",
                    "HEAD",
                    "--budget",
                    "15%",
                    "--agent",
                    agent,
                    "--json",
                ],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "CI_RELAY_CACHE_DIR": str(work / "evalcache")},
            )
            data = json.loads(out.stdout)
            figures = ", ".join(
                f"{name} recall {v['test_file_recall']:.2f}"
                for name, v in data["strategies"].items()
            )
            print(
                f"select-eval sample upstream, agent {agent}, 15%: "
                f"{data['commits_evaluated']} commits; {figures}"
            )


if __name__ == "__main__":
    main()
