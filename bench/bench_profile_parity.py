"""``specs profile-check`` on PyTorch's whole OpInfo database: its cost, and whether its
prediction matches what the emulator then does.

1. Writes a spec listing every OpInfo name of the installed torch under ``supported_ops``
   (``supported_dtypes``: ``--dtypes``, default float32, float16, bfloat16) and runs the
   parity check against a profile (default: the bundled one). Baseline, same run: the same
   sample inputs without the recording dispatch mode. Prints both and the ratio.
2. Loads ``spyre_emu`` with that profile and runs the same samples on ``spyre:0``; an op the
   check says the profile refuses (an aten overload or a dtype) should raise
   ``UnsupportedOpError`` / ``UnsupportedDtypeError`` there, and one it says runs should
   not. Prints the agreement table and every disagreement.

Needs only the installed torch (real data: PyTorch's own OpInfo database and sample inputs).
Run: ``python bench/bench_profile_parity.py [--profile FILE] [--limit N] [--dtypes A,B]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch.testing._internal.common_methods_invocations import op_db

from spyre_emu.profile import DEFAULT_PROFILE_FILE, PROFILE_ENV, load_profile_file
from spyre_emu.spec_parity import check_profile_parity, first_samples, refused


def _spec(names: list[str], dtypes: list[str], folder: Path) -> Path:
    listed = ", ".join(f"{{name: {d}}}" for d in dtypes)
    lines = [
        "test_suite_config:",
        "  files:",
        "    - path: ${TORCH_ROOT}/test/test_ops.py",
        "  global:",
        f"    supported_dtypes: [{listed}]",
        "    supported_ops:",
        *(f"      - {name!r}" for name in names),
    ]
    path = folder / "every_opinfo.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _plain(ops: list[Any], dtypes: list[Any]) -> float:
    """The baseline: the same samples, no recording."""
    start = time.perf_counter()
    for opinfo in ops:
        supported = opinfo.supported_dtypes("cpu")
        dtype = next((d for d in dtypes if d in supported), None)
        if dtype is None:
            continue
        try:
            for sample in first_samples(opinfo, dtype):
                opinfo.op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # the check reports these; the baseline skips them
            continue
    return time.perf_counter() - start


def _on_device(opinfo: Any, dtype: Any) -> str:
    """What the emulator does with the op's samples: ran, refused, or another error."""
    import spyre_emu

    try:
        for sample in first_samples(opinfo, dtype):
            moved = sample.transform(lambda t: t.to("spyre") if isinstance(t, torch.Tensor) else t)
            opinfo.op(moved.input, *moved.args, **moved.kwargs)
    except (spyre_emu.UnsupportedOpError, spyre_emu.UnsupportedDtypeError):
        return "refused"
    except Exception as exc:  # counted, shown below
        return f"other: {type(exc).__name__}"
    return "ran"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=0, help="only the first N op names")
    parser.add_argument(
        "--dtypes",
        default="float32,float16,bfloat16",
        help="the spec's supported_dtypes, in the order ops are traced with (first supported)",
    )
    args = parser.parse_args()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    warnings.filterwarnings("ignore")  # upstream samples' deprecation notes drown the table
    profile_path = args.profile or DEFAULT_PROFILE_FILE
    profile = load_profile_file(profile_path)
    names = sorted({op.name for op in op_db})
    if args.limit:
        names = names[: args.limit]
    ops = [op for op in op_db if op.name in set(names)]
    print(
        f"torch {torch.__version__}: {len(names)} OpInfo names, {len(ops)} OpInfos; profile "
        f"{profile.name!r}; traced in the first of {', '.join(dtypes)} each op supports"
    )

    with tempfile.TemporaryDirectory() as tmp:
        spec = _spec(names, dtypes, Path(tmp))
        start = time.perf_counter()
        report = check_profile_parity([spec], profile, str(profile_path))
        checked = time.perf_counter() - start
    plain = _plain(ops, [getattr(torch, d) for d in dtypes])
    print(f"parity check {checked:.1f} s, plain samples {plain:.1f} s, ratio {checked / plain:.2f}")
    counts: dict[str, int] = {}
    for finding in report.findings:
        counts[finding.severity] = counts.get(finding.severity, 0) + 1
    print(f"findings: {counts} ({len(report.traced)} traced)")

    os.environ[PROFILE_ENV] = str(profile_path)
    import spyre_emu

    spyre_emu.load()
    table: dict[tuple[str, str], int] = {}
    disagreements: list[str] = []
    for trace in report.traced:
        if trace.dtype is None or (trace.problem is not None and not trace.aten):
            continue
        opinfo = next(op for op in ops if op.full_name == trace.op_name)
        predicted = "refused" if refused(profile, trace) else "ran"
        actual = _on_device(opinfo, trace.dtype)
        table[(predicted, actual)] = table.get((predicted, actual), 0) + 1
        if actual != predicted:
            disagreements.append(
                f"  {trace.op_name} ({trace.dtype}): check {predicted}, emulator {actual}"
            )
    agree = sum(n for (p, a), n in table.items() if p == a)
    decided = sum(n for (p, a), n in table.items() if a in ("ran", "refused"))
    print("check prediction -> emulator outcome:")
    for (predicted, actual), n in sorted(table.items()):
        print(f"  {predicted:8} -> {actual:28} {n}")
    print(
        f"agreement where the emulator ran or refused: {agree}/{decided} "
        f"({agree / max(decided, 1):.3f})"
    )
    print("\n".join(disagreements[:40]))


if __name__ == "__main__":
    main()
