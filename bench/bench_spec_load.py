"""Load, check and expand 50 spec files over a synthetic 1,000-file upstream.

"Expand" means: resolve every path and glob, check every listed name against
the upstream's AST index, and decide the mode of every test function the
upstream defines. Baseline in the same run: ``yaml.safe_load`` of the same 50
files (the floor any loader pays). Goal: the full job under 1 s.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import yaml

from reuse_specs import load_specs
from reuse_specs.matching import TestVariant, decide
from reuse_specs.upstream_check import check_against_upstream
from reuse_specs.upstream_index import index_test_file

FILES = 1000
SPECS = 50
CLASSES_PER_FILE = 2
TESTS_PER_CLASS = 8


def _make_upstream(root: Path) -> None:
    for i in range(FILES):
        lines = ["import torch", ""]
        for c in range(CLASSES_PER_FILE):
            lines.append(f"class TestArea{i}Part{c}:")
            lines += [
                f"    def test_case_{t}(self, device):\n        pass"
                for t in range(TESTS_PER_CLASS)
            ]
            lines.append("")
        path = root / "test" / f"area{i // 100}" / f"test_area_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines))


def _make_specs(root: Path) -> list[Path]:
    specs = []
    per_spec = FILES // SPECS
    for s in range(SPECS):
        files = []
        for i in range(s * per_spec, (s + 1) * per_spec):
            files.append(
                f"    - path: ${{TORCH_ROOT}}/test/area{i // 100}/test_area_{i}.py\n"
                "      unlisted_test_mode: xfail\n"
                "      tests:\n"
                f"        - names: [TestArea{i}Part0::test_case_0, TestArea{i}Part0::test_case_1]\n"
                "          tags: [smoke]\n"
                f"        - names: ['TestArea{i}Part1::test_case_*']\n"
                "          mode: skip\n"
            )
        text = (
            "test_suite_config:\n  labels: [trunk]\n  files:\n"
            + "".join(files)
            + "  global:\n    supported_dtypes: [{name: float16}, {name: float32}]\n"
        )
        path = root / "specs" / f"spec_{s}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        specs.append(path)
    return specs


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-specs-") as tmp:
        root = Path(tmp)
        _make_upstream(root / "upstream")
        specs = _make_specs(root)

        start = time.perf_counter()
        fastest_safe_loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        for path in specs:
            yaml.load(path.read_text(), Loader=fastest_safe_loader)
        baseline = time.perf_counter() - start

        start = time.perf_counter()
        spec = load_specs(specs, root / "upstream")
        loaded = time.perf_counter() - start
        check_against_upstream(spec)
        checked = time.perf_counter() - start
        decisions = 0
        for path in spec.test_files():
            for cls, methods in index_test_file(path).classes.items():
                for method in methods:
                    decide(spec, TestVariant(path, cls, method))
                    decisions += 1
        total = time.perf_counter() - start

        print(
            f"{len(specs)} spec files, {len(spec.test_files())} upstream files, "
            f"{decisions} tests decided"
        )
        print(f"yaml.safe_load baseline: {baseline:.3f}s")
        print(f"load+validate {loaded:.3f}s, +upstream check {checked:.3f}s, +expand {total:.3f}s")
        print(
            f"ratio full job / yaml baseline = {total / baseline:.2f}; "
            f"full job {total:.3f}s (goal < 1 s)"
        )


if __name__ == "__main__":
    main()
