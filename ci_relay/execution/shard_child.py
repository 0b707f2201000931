"""The process a shard runs in its runtime: the upstream tests under the reuse specs, with
the crash-proof progress log and the per-test timeout.

Not ``ci-relay run``: a shard may start this process again after a crash (with
``--restart-in-process`` it forks its own test process instead, :mod:`.crash_restarts`), and
on a 25,000-variant file every second of start-up counts. So it imports pytest, the spec
loader and the plugins, nothing of the CLI (Typer, Rich), and skips what the worker has
already done (drift report, summary table). Its stdout is pytest's, sent to /dev/null
(results go to the progress log); its stderr carries faulthandler's stack on a crash.

    python -m ci_relay.execution.shard_child --upstream DIR --spec FILE ... --backend NAME
        --tests FILE --deselect FILE --progress FILE [--per-test-timeout SECONDS]
        [--label LABEL] [--restart-in-process] [--coverage-stream FILE] [--backends-dir DIR]

``--backends-dir``: the copy of a declared backend's declaration the runner put in scratch
(a backend that does not ship with ci-relay; :func:`ci_relay.execution.shard._copy_declaration`).

With ``--coverage-stream`` each test's executed functions are appended to FILE as it ends
(``test_selection.coverage_recorder``): the relay's per-test coverage map, recorded where the
tests really run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ci_relay.execution import crash_restarts
from ci_relay.execution.spec_run import (
    EXIT_BAD_INPUT,
    EXIT_INFRASTRUCTURE,
    EXIT_NOTHING_SELECTED,
    pytest_args,
    run_pytest,
)
from reuse_specs.backends import (
    BackendUnavailable,
    UnknownBackend,
    add_backends_dir,
    get_backend,
)
from reuse_specs.errors import SpecErrors
from reuse_specs.loader import load_specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci_relay.execution.shard_child")
    parser.add_argument("--upstream", type=Path, required=True)
    parser.add_argument("--spec", type=Path, action="append", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--tests", type=Path, required=True)
    parser.add_argument("--deselect", type=Path, required=True)
    parser.add_argument("--progress", type=Path, required=True)
    parser.add_argument("--per-test-timeout", type=float, default=None)
    parser.add_argument("--label", default=None)
    parser.add_argument("--restart-in-process", action="store_true")
    parser.add_argument("--coverage-stream", type=Path, default=None)
    parser.add_argument("--backends-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    upstream = args.upstream.resolve()
    if args.backends_dir is not None:
        add_backends_dir(args.backends_dir)
    try:
        backend = get_backend(args.backend)
        backend.check()
        loaded = load_specs(args.spec, upstream, backend.name)
    except (UnknownBackend, SpecErrors) as exc:
        print(f"shard child: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BackendUnavailable as exc:
        print(f"shard child: {exc}", file=sys.stderr)
        return EXIT_INFRASTRUCTURE
    if not loaded.test_files():
        print("shard child: none of the spec's files exists in this tree", file=sys.stderr)
        return EXIT_NOTHING_SELECTED
    extra = ["--reuse-deselect", str(args.deselect)]
    extra += ["-p", "ci_relay.execution.progress_plugin", "--progress-log", str(args.progress)]
    if args.restart_in_process:  # a crash costs one test, not a collection
        extra += ["-p", "ci_relay.execution.crash_restarts", "--restart-crashes-in-process"]
        crash_restarts.stderr_fd = os.dup(2)  # before pytest captures fd 2
    if args.per_test_timeout:
        extra += ["--per-test-timeout", str(args.per_test_timeout)]
    if args.coverage_stream is not None:
        extra += ["-p", "test_selection.coverage_recorder", "--coverage-root", str(upstream)]
        extra += ["--coverage-stream", str(args.coverage_stream)]
    result, _ = run_pytest(
        lambda ini: pytest_args(
            args.spec,
            loaded,
            upstream,
            backend,
            ini,
            label=args.label,
            tests_file=args.tests,
            extra=extra,
        ),
        upstream,
    )
    if crash_restarts.exit_code is not None:  # the tests ran in forked processes
        return crash_restarts.exit_code
    counts = ", ".join(f"{n} {k}" for k, n in sorted(result.counts.items()))
    print(f"shard child: {counts or 'no result'}", file=sys.stderr)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
