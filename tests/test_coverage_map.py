"""Per-test coverage maps (issue 34): recorded with the real pytest plugin on real git
repositories built here, read back, and used by ``ci-relay select``, where they find the one
right test inside a large file that nothing else in the change points to."""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from test_selection.coverage.map import (
    FORMAT,
    MAX_DEPTH,
    CoverageMap,
    CoverageMapError,
)
from tests.conftest import CliResult
from tests.gitrepo import GitRepo

N = 40  # functions behind one dispatcher, and tests in the large file


def dispatcher(n: int) -> str:
    """A module of ``n`` implementations behind one dispatcher: which one a test reaches is
    in no word of the test, only in what it executes."""
    return "\n".join(
        [
            "def dispatch(n):",
            "    return TABLE[n](n)",
            "",
            *(f"def _impl_{i}(n):\n    return n * {i + 2}\n" for i in range(n)),
            f"TABLE = [{', '.join(f'_impl_{i}' for i in range(n))}]",
            "",
        ]
    )


CORE = dispatcher(N)
# every test reads alike: nothing in its words says which implementation it reaches
LARGE = "from pkg.core import dispatch\n\n" + "\n".join(
    f"def test_case_{i:02d}():\n    assert dispatch({i}) == {i} * {i + 2}\n" for i in range(N)
)
OTHER = "from pkg import util\n\n\ndef test_util():\n    assert util.double(2) == 4\n"


def _upstream(tmp_path: Path) -> tuple[GitRepo, str]:
    repo = GitRepo(tmp_path / "up")
    repo.git("remote", "add", "origin", "https://github.com/example/dispatcher.git")
    base = repo.commit(
        "base",
        {
            "pkg/__init__.py": "",
            "pkg/core.py": CORE,
            "pkg/util.py": "def double(x):\n    return 2 * x\n",
            "tests/test_core.py": LARGE,
            "tests/test_util.py": OTHER,
        },
        dedent=False,
    )
    return repo, base


def _record(cli: Callable[..., CliResult], repo: GitRepo, rev: str, out: Path) -> CliResult:
    return cli("coverage", "record", "--upstream", repo.path, "--rev", rev, "-o", out)


def _select(cli: Callable[..., CliResult], repo: GitRepo, *extra: str | Path) -> CliResult:
    return cli(
        "select", "--upstream", repo.path, "--base", "HEAD~1", "--head", "HEAD",
        "--budget", "2", "--agent", "none", "--json", *extra,
    )  # fmt: skip


def test_only_the_map_finds_the_right_test_inside_a_large_file(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, base = _upstream(tmp_path)
    cmap_file = tmp_path / "map.json.gz"
    recorded = _record(cli, repo, base, cmap_file)
    assert recorded.code == 0, recorded.output
    assert f"recorded {N + 1} test(s)" in recorded.output
    cmap = CoverageMap.load(cmap_file)
    assert (cmap.repository, cmap.revision) == ("example/dispatcher", base)
    assert cmap.tests["tests/test_core.py::test_case_23"] == {
        ("pkg/core.py", "dispatch"): 1,
        ("pkg/core.py", "_impl_23"): 2,
        ("tests/test_core.py", "test_case_23"): 1,
    }
    # the change: one implementation behind the dispatcher (a later commit, so the map is
    # older than the base, as it normally is)
    repo.commit("unrelated", {"README": "x\n"})
    repo.commit("fix 23", {"pkg/core.py": CORE.replace("n * 25\n", "n * 25 + 0\n")})

    plain = _select(cli, repo)
    assert plain.code == 0, plain.output
    chosen = [t["test"] for t in json.loads(plain.stdout)["selected"]]
    assert len(chosen) == 2 and "tests/test_core.py::test_case_23" not in chosen, chosen

    mapped = _select(cli, repo, "--coverage", cmap_file)
    assert mapped.code == 0, mapped.output
    plan = json.loads(mapped.stdout)
    chosen = [t["test"] for t in plan["selected"]]
    assert chosen[0] == "tests/test_core.py::test_case_23", chosen
    assert plan["coverage"]["revision"] == base
    assert plan["coverage"]["commits_behind"] == 1
    assert plan["coverage"]["known_functions"] == ["pkg/core.py:_impl_23"]
    reasons = [e["reason"] for e in plan["selected"][0]["evidence"] if e["source"] == "coverage"]
    assert reasons and "executed changed pkg/core.py:_impl_23 (2 calls deep" in reasons[0]
    assert any("coverage map" in note and "knew 1 of 1" in note for note in plan["notes"])

    shown = cli("coverage", "show", cmap_file, "--json")
    assert shown.code == 0, shown.output
    summary = json.loads(shown.stdout)
    assert summary["tests"] == N + 1 and summary["busiest"][0] == {
        "function": "pkg/core.py:dispatch",
        "tests": N,
    }


def test_a_map_select_cannot_use_is_refused_with_what_it_is(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, base = _upstream(tmp_path)
    repo.commit("fix 3", {"pkg/core.py": CORE.replace("n * 5\n", "n * 5 + 0\n")})
    cases: dict[str, tuple[object, str]] = {
        "other-repo": (
            CoverageMap("someone/else", base).to_json(),
            "the coverage map is of 'someone/else', this upstream is 'example/dispatcher'",
        ),
        "unknown-revision": (
            CoverageMap("example/dispatcher", "ab" * 20).to_json(),
            "revision abababababab is not in",
        ),
        "newer-format": (
            {**CoverageMap("example/dispatcher", base).to_json(), "format": "ci-relay-coverage/9"},
            f"is not one this version reads (expected '{FORMAT}')",
        ),
        "damaged": ({"format": FORMAT, "repository": "x"}, "a damaged coverage map"),
        "recorded-nothing": (
            {**CoverageMap("example/dispatcher", base).to_json(), "collected": 0},
            f"the coverage map of {base[:12]} cannot be used: pytest collected no test",
        ),
        "collection-error": (
            {
                **CoverageMap("example/dispatcher", base).to_json(),
                "collection_errors": ["tests/test_x.py: ImportError: no module named y"],
            },
            "cannot be used: pytest could not collect the tests: tests/test_x.py: ImportError",
        ),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / f"{name}.json.gz"
        with gzip.open(path, "wt") as stream:
            json.dump(data, stream)
        result = _select(cli, repo, "--coverage", path)
        assert result.code == 2 and message in result.output, (name, result.output)
    garbage = tmp_path / "garbage.json.gz"
    garbage.write_bytes(b"\x1f\x8b not really gzip")
    result = _select(cli, repo, "--coverage", garbage)
    assert result.code == 2 and "not a readable coverage map" in result.output, result.output
    missing = _select(cli, repo, "--coverage", tmp_path / "nope.json.gz")
    assert missing.code == 2 and "no such coverage map" in missing.output


def test_record_refuses_a_run_that_collected_nothing_or_failed_to_collect(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """A map of nothing would pass for a map that knows no test: every test would look newer
    than it. Recording refuses it, names why, and writes no file (an older map at the same
    path stays as it was)."""
    repo, base = _upstream(tmp_path)
    out = tmp_path / "map.json.gz"
    assert _record(cli, repo, base, out).code == 0
    kept = out.read_bytes()
    nothing = cli("coverage", "record", "--upstream", repo.path, "--rev", base, "-o", out,
                  "--", "-k", "no_test_has_this_name")  # fmt: skip
    assert nothing.code == 1, nothing.output
    assert "no map written: pytest collected no test (pytest exit 5" in nothing.output
    broken = repo.commit(
        "broken", {"tests/test_util.py": "import no_such_module_anywhere\n" + OTHER}, dedent=False
    )
    failed = _record(cli, repo, broken, out)
    assert failed.code == 1, failed.output
    assert (
        "no map written: pytest could not collect the tests: tests/test_util.py: "
        "ModuleNotFoundError: No module named 'no_such_module_anywhere'"
    ) in failed.output.replace("\n", " ")
    assert "pytest exit 2, 0 test(s) recorded" in failed.output
    assert out.read_bytes() == kept
    # leaving the broken file out records the rest, and the map says what was collected
    rest = cli("coverage", "record", "--upstream", repo.path, "--rev", broken, "-o", out,
               "--", "--ignore", "tests/test_util.py")  # fmt: skip
    assert rest.code == 0, rest.output
    cmap = CoverageMap.load(out)
    assert (len(cmap.tests), cmap.collected, cmap.collection_errors) == (N, N, [])


def test_record_since_an_older_map_runs_again_only_what_the_change_can_reach(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """--since keeps every test whose file and executed code the change left alone; the map
    it writes is the one a full recording gives."""
    repo, base = _upstream(tmp_path)
    old = tmp_path / "old.json.gz"
    assert _record(cli, repo, base, old).code == 0
    util = repo.commit("util", {"pkg/util.py": "def double(x):\n    return x + x\n"})
    since = tmp_path / "since.json.gz"
    done = cli("coverage", "record", "--upstream", repo.path, "--rev", util, "-o", since,
               "--since", old)  # fmt: skip
    assert done.code == 0, done.output
    said = " ".join(done.output.split())
    assert (
        f"1 test file(s) run again (changed, or a test of them executed a changed function), "
        f"{N} test(s) kept from {base[:12]}"
    ) in said, said
    full = tmp_path / "full.json.gz"
    assert _record(cli, repo, util, full).code == 0
    incremental, whole = CoverageMap.load(since), CoverageMap.load(full)
    assert (incremental.revision, incremental.reused, incremental.reused_from) == (util, N, base)
    assert incremental.tests == whole.tests
    # a change no function record shows: the tests below a changed conftest.py run again
    conf = repo.commit("conftest", {"tests/conftest.py": "import os\n"})
    again = cli("coverage", "record", "--upstream", repo.path, "--rev", conf, "-o",
                tmp_path / "conf.json.gz", "--since", full)  # fmt: skip
    assert again.code == 0 and "2 test file(s) run again" in again.output, again.output
    # nothing to run again: the kept records are the map, and no pytest runs
    readme = repo.commit("docs", {"README": "x\n"})
    kept = cli("coverage", "record", "--upstream", repo.path, "--rev", readme, "-o",
               tmp_path / "readme.json.gz", "--since", tmp_path / "conf.json.gz")  # fmt: skip
    assert kept.code == 0 and "0 test file(s) run again" in kept.output, kept.output
    assert CoverageMap.load(tmp_path / "readme.json.gz").tests == whole.tests
    # pytest's own settings changed: everything runs again
    settings = repo.commit(
        "settings", {"pyproject.toml": "[tool.pytest.ini_options]\nxfail_strict = true\n"}
    )
    everything = cli("coverage", "record", "--upstream", repo.path, "--rev", settings, "-o",
                     tmp_path / "all.json.gz", "--since", full)  # fmt: skip
    assert everything.code == 0, everything.output
    assert "pytest's settings in pyproject.toml changed: all run again" in everything.output
    other = tmp_path / "other.json.gz"
    CoverageMap("someone/else", base, collected=1).save(other)
    refused = cli("coverage", "record", "--upstream", repo.path, "-o", tmp_path / "x.json.gz",
                  "--since", other)  # fmt: skip
    assert refused.code == 2 and "--since: the map is of 'someone/else'" in refused.output


def test_record_since_reruns_the_tests_of_a_changed_body_and_every_user_of_a_changed_module(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """Function granularity (as pytest-testmon): a change inside one function's body runs
    again only the test files that executed that function; a change outside the bodies (a
    module constant, a signature) runs again every test file that executed the module. Each
    incremental map equals a full recording."""
    repo = GitRepo(tmp_path / "up")
    mod = (
        "SCALE = 2\n\n\ndef f(x):\n    return x * SCALE\n\n\n"
        "def g(x):\n    def inner(y):\n        return y + 1\n\n    return inner(x)\n"
    )
    base = repo.commit(
        "base",
        {
            "pkg/__init__.py": "",
            "pkg/mod.py": mod,
            "tests/test_f.py": "from pkg.mod import f\n\n\ndef test_f():\n    assert f(2) > 3\n",
            "tests/test_g.py": "from pkg.mod import g\n\n\ndef test_g():\n    assert g(2) == 3\n",
        },
        dedent=False,
    )
    maps = tmp_path / "maps"
    maps.mkdir()
    previous = maps / "base.json.gz"
    assert _record(cli, repo, base, previous).code == 0
    steps = [  # each on top of the one before
        ("g's nested function", ("y + 1", "1 + y"), "1 test file(s) run again", 1),
        ("f's body", ("x * SCALE", "SCALE * x"), "1 test file(s) run again", 1),
        ("a module constant", ("SCALE = 2", "SCALE = 3"), "2 test file(s) run again", 0),
        ("f's signature", ("def f(x):", "def f(x, y=0):"), "2 test file(s) run again", 0),
    ]
    for what, (old, new), reran, narrowed in steps:
        text = mod.replace(old, new)
        sha = repo.commit(what, {"pkg/mod.py": text}, dedent=False)
        since = maps / f"{sha}.json.gz"
        done = cli("coverage", "record", "--upstream", repo.path, "--rev", sha, "-o", since,
                   "--since", previous)  # fmt: skip
        assert done.code == 0, (what, done.output)
        said = " ".join(done.output.split())
        assert reran in said, (what, said)
        assert f"{narrowed} of the 1 changed Python file(s) changed function bodies only" in said
        full = maps / f"{sha}-full.json.gz"
        assert _record(cli, repo, sha, full).code == 0
        assert CoverageMap.load(since).tests == CoverageMap.load(full).tests, what
        previous = since
        mod = text


def test_tests_that_start_threads_or_processes_or_take_the_profiler_are_flagged(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo = GitRepo(tmp_path / "up")
    sha = repo.commit(
        "base",
        {
            "pkg/__init__.py": "",
            "pkg/mod.py": "def f():\n    return 1\n\n\ndef g():\n    return f()\n",
            "tests/test_mod.py": """
                import subprocess
                import sys
                import threading

                from pkg.mod import f, g


                def test_thread():
                    t = threading.Thread(target=g)
                    t.start()
                    t.join()
                    assert f() == 1


                def test_process():
                    subprocess.run([sys.executable, "-c", "pass"], check=True)
                    assert g() == 1


                def test_own_profiler():
                    sys.setprofile(None)
                    assert g() == 1


                def test_plain():
                    assert g() == 1


                def test_fails():
                    assert g() == 2
            """,
        },
    )
    out = tmp_path / "m.json.gz"
    result = _record(cli, repo, sha, out)
    assert result.code == 0 and "pytest exit 1" in result.output, result.output
    cmap = CoverageMap.load(out)
    flags = {t.split("::")[-1]: sorted(v) for t, v in cmap.flags.items()}
    assert flags == {
        "test_thread": ["threads"],
        "test_process": ["processes"],
        "test_own_profiler": ["profiler-replaced"],
    }
    tests = {t.split("::")[-1]: f for t, f in cmap.tests.items()}
    assert tests["test_plain"][("pkg/mod.py", "f")] == 2  # test -> g -> f
    assert ("pkg/mod.py", "g") in tests["test_process"]  # recorded as far as it went
    assert ("pkg/mod.py", "g") in tests["test_fails"]  # failing tests count
    # the profiler sees the test's own calls (f, directly); the thread's (g) come from the
    # lines coverage.py traced there, at the farthest distance
    assert tests["test_thread"][("pkg/mod.py", "f")] == 1
    assert tests["test_thread"][("pkg/mod.py", "g")] == MAX_DEPTH


def test_a_map_round_trips_merges_and_keeps_the_shortest_distance(tmp_path: Path) -> None:
    sha = "c" * 40
    a = CoverageMap("o/r", sha, backend="cpu")
    a.add("t.py::test_x", {("p.py", "f"): 3, ("p.py", "g"): 99})
    a.add("t.py::test_y", {("p.py", "f"): 3, ("p.py", "g"): 99})  # same set: shared entry
    b = CoverageMap("o/r", sha)
    b.add("t.py::test_x", {("p.py", "f"): 1}, ["threads", "not-a-flag"])
    a.merge(b)
    assert a.tests["t.py::test_x"] == {("p.py", "f"): 1, ("p.py", "g"): MAX_DEPTH}
    assert a.flags == {"t.py::test_x": {"threads"}}
    data = a.to_json()
    assert len(data["sets"]) == 2 and data["tests"]["t.py::test_y"] != data["tests"]["t.py::test_x"]
    again = CoverageMap.load(a.save(tmp_path / "m.json.gz"))
    assert again.tests == a.tests and again.flags == a.flags and again.backend == "cpu"
    with pytest.raises(CoverageMapError, match="cannot merge a map of o/other"):
        a.merge(CoverageMap("o/other", sha))
    reach = a.index().reaches([("p.py", "f")])
    assert reach["t.py::test_x"].depth == 1 and reach["t.py::test_y"].depth == 3
    assert reach["t.py::test_x"].specificity > reach["t.py::test_y"].specificity
    a.add("t.py::test_z", {("p.py", "K.m"): 1})
    index = a.index()  # a changed class covers its methods; a moved def is found by name
    assert index.resolve("p.py", "K") == [("p.py", "K.m")]
    assert index.resolve("p.py", "Other.m") == [("p.py", "K.m")]
    assert index.resolve("p.py", "nothing") == []


def test_record_runs_the_tests_with_the_python_named(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    repo, base = _upstream(tmp_path)
    other = tmp_path / "bin" / "python3"  # another path to a Python: the plugin folder is used
    other.parent.mkdir()
    other.symlink_to(sys.executable)
    out = tmp_path / "map.json.gz"
    done = cli("coverage", "record", "--upstream", repo.path, "--rev", base, "-o", out,
               "--python", other)  # fmt: skip
    assert done.code == 0, done.output
    assert len(CoverageMap.load(out).tests) == N + 1
    for python, message in (
        (tmp_path / "missing-python", "cannot run it"),
        (_script(tmp_path / "no-pytest", "import sys; sys.exit(1)"), "cannot import pytest"),
    ):
        refused = cli("coverage", "record", "--upstream", repo.path, "--rev", base, "-o",
                      tmp_path / "x.json.gz", "--python", python)  # fmt: skip
        assert refused.code == 2 and f"--python {python}: {message}" in refused.output, (
            refused.output
        )
        assert not (tmp_path / "x.json.gz").exists()


def _script(path: Path, body: str) -> Path:
    """An executable that ignores its arguments and runs ``body`` with this Python."""
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(0o755)
    return path


def test_record_with_installed_keeps_the_installed_package_and_the_checkouts_names(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """PyTorch's checkout holds ``torch/`` sources that cannot be imported without a build:
    its tests import the installed torch. ``--installed`` keeps the checkout off the path and
    records the installed package's functions under the checkout's file names."""
    repo, _ = _upstream(tmp_path)
    stand_in = "raise ImportError('a source tree: import the installed pkg')\n"
    head = repo.commit("stand-in", {"pkg/__init__.py": stand_in}, dedent=False)
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("")
    (site / "pkg" / "core.py").write_text(CORE)
    (site / "pkg" / "util.py").write_text("def double(x):\n    return 2 * x\n")
    env = {"PYTHONPATH": str(site)}
    out = tmp_path / "map.json.gz"
    plain = cli("coverage", "record", "--upstream", repo.path, "--rev", head, "-o", out, env=env)
    # the stand-in was imported: collection errors, nothing recorded, no map written
    assert plain.code == 1, plain.output
    assert "no map written: pytest could not collect the tests: tests/test_core.py" in plain.output
    assert "ImportError: a source tree: import the installed pkg" in plain.output
    assert not out.exists()
    done = cli("coverage", "record", "--upstream", repo.path, "--rev", head, "-o", out,
               "--installed", "pkg", env=env)  # fmt: skip
    assert done.code == 0, done.output
    cmap = CoverageMap.load(out)
    assert len(cmap.tests) == N + 1
    index = cmap.index()
    assert set(index.reaches(index.resolve("pkg/util.py", "double"))) == {
        "tests/test_util.py::test_util"
    }
    assert set(index.reaches(index.resolve("pkg/core.py", "_impl_3"))) == {
        "tests/test_core.py::test_case_03"
    }
    bad = cli("coverage", "record", "--upstream", repo.path, "-o", out, "--installed", "x/y")
    assert bad.code == 2 and "not a package name" in bad.output


def test_record_since_leaves_out_what_norecursedirs_keeps_pytest_from(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """A folder of type-checker cases that raise on import, kept from pytest by
    norecursedirs: --since names the files to run again, and named files bypass
    norecursedirs, so it leaves them out itself (before, its map was refused)."""
    repo, _base = _upstream(tmp_path)
    cases = "from pkg.util import double\n\nraise RuntimeError('a type-checker case')\n"
    base = repo.commit(
        "typing cases",
        {
            "pyproject.toml": "[tool.pytest.ini_options]\nnorecursedirs = ['typing']\n",
            "tests/typing/test_cases.py": cases,
        },
    )
    old = tmp_path / "old.json.gz"
    assert _record(cli, repo, base, old).code == 0
    util = repo.commit(
        "util",
        {
            "pkg/util.py": "def double(x):\n    return x + x\n",
            "tests/typing/test_cases.py": cases + "# more\n",
        },
    )
    since = tmp_path / "since.json.gz"
    done = cli("coverage", "record", "--upstream", repo.path, "--rev", util, "-o", since,
               "--since", old)  # fmt: skip
    assert done.code == 0, done.output
    assert "1 test file(s) run again" in " ".join(done.output.split()), done.output
    assert not any("typing" in t for t in CoverageMap.load(since).tests)
