"""The pytest plugin of ``bench/bench_mutation.py`` (``-p mutation_plugin``, this folder and
the repository on ``PYTHONPATH``), configured by the JSON file ``$MUTATION_PLUGIN_SPEC``
names: ``{"mutant": {...} | null, "log": FILE, "root": DIR, "skip": [node ids],
"only": [generic ids] | null}``.

With a mutant, before collection it imports the mutant's module, finds the function (through
decorator wrappers' ``__wrapped__``, a class's ``__dict__``, and else every function object of
that file and qualified name) and replaces its code object with the mutated source compiled
alone: the function object stays the same, so re-exported aliases, wrappers and registration
tables run the mutant too. The installed files are never edited.

Every run (with or without a mutant) appends to the log, one JSON line each: the mutant applied
(``{"applied": N}``) or why not (``{"error": ...}``, and the run stops), each test's start
(``{"start": nodeid, "test": generic id}``) and its outcome (``{"nodeid", "outcome"}``:
``passed``, ``failed``, ``skipped``), and each file that failed to collect
(``{"collect_error": file}``). The runner reads a started test with no outcome as the one
that hung or crashed the process. ``"only"`` (generic ids) keeps just those tests.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import inspect
import itertools
import json
import os
import types
from pathlib import Path
from typing import Any

import pytest

from test_selection.coverage.recorder import generic_test_id

PERTURB = "__mutation_perturb__"


PERTURBED = {"changed": 0, "unchanged": 0, "types": set()}


def perturb(value: Any) -> Any:
    """``value`` with one element wrong (the ``return`` operator's helper); counts the calls
    that changed nothing (an empty value, a type it does not know), for the runner's record."""
    out = _perturb(value)
    if out is value:
        PERTURBED["unchanged"] += 1
        PERTURBED["types"].add(type(value).__qualname__)
    else:
        PERTURBED["changed"] += 1
    return out


def _perturb(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float | complex):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    module = type(value).__module__ or ""
    if module.startswith("torch") and hasattr(value, "numel") and hasattr(value, "clone"):
        if value.numel() == 0:
            return value
        out = value.clone()
        flat = out.view(-1) if out.is_contiguous() else None
        if flat is None:
            out = out.contiguous()
            flat = out.view(-1)
        if str(out.dtype) == "torch.bool":
            flat[0] = not bool(flat[0])
        else:
            flat[0] = flat[0] + 1
        return out
    if module.startswith("numpy") and hasattr(value, "flat") and hasattr(value, "copy"):
        if getattr(value, "size", 0) == 0:
            return value
        out = value.copy()
        out.flat[0] = (not out.flat[0]) if out.dtype == bool else out.flat[0] + 1
        return out
    if hasattr(value, "remove_node") and hasattr(value, "copy") and hasattr(value, "nodes"):
        nodes = list(value.nodes)
        if not nodes:
            return value
        graph = value.copy()
        graph.remove_node(nodes[-1])  # a graph without its last node
        return graph
    if isinstance(value, list | tuple):
        return type(value)(value[:-1]) if value else value
    if isinstance(value, dict):
        if not value:
            return value
        out_dict = dict(value)
        out_dict.pop(next(reversed(out_dict)))
        return type(value)(out_dict) if type(value) is not dict else out_dict
    if isinstance(value, set | frozenset):
        if not value:
            return value
        items = list(value)
        return type(value)(items[1:])
    if isinstance(value, types.GeneratorType) or (
        hasattr(value, "__next__") and hasattr(value, "__iter__")
    ):
        return itertools.islice(value, 1, None)
    return value


def _compile(source: str, qualname: str, filename: str, firstline: int) -> types.CodeType:
    """The code object of the mutated def, compiled inside a class when it is a method (so a
    zero-argument ``super()`` gets its ``__class__`` cell)."""
    tree = ast.parse(source)
    ast.increment_lineno(tree, firstline - 1)
    name = qualname.rsplit(".", 1)[-1]
    body: list[ast.stmt] = list(tree.body)
    if "." in qualname:
        cls = ast.ClassDef(
            name=qualname.split(".", 1)[0],
            bases=[],
            keywords=[],
            body=body,
            decorator_list=[],
            type_params=[],
        )
        body = [cls]
    module = ast.Module(body=body, type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec", dont_inherit=True)

    def find(c: types.CodeType) -> types.CodeType | None:
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                if const.co_name == name and const.co_qualname == qualname:
                    return const
                inner = find(const)
                if inner is not None:
                    return inner
        return None

    found = find(code)
    if found is None:
        raise RuntimeError(f"the mutated source does not define {qualname}")
    return found


def _originals(module: types.ModuleType, qualname: str, filename: str) -> list[types.FunctionType]:
    """The function objects whose code is ``qualname`` of ``filename``."""
    found: list[types.FunctionType] = []

    def matches(obj: object) -> bool:
        if not isinstance(obj, types.FunctionType):  # before any getattr: lazy modules import
            return False
        code = obj.__code__
        return code.co_qualname == qualname and os.path.realpath(
            code.co_filename
        ) == os.path.realpath(filename)

    holder: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        holder = getattr(holder, part, None)
    if holder is not None:
        raw = holder.__dict__.get(parts[-1]) if hasattr(holder, "__dict__") else None
        raw = getattr(raw, "__func__", raw)  # staticmethod, classmethod
        if raw is not None:
            with contextlib.suppress(ValueError):  # a cycle of __wrapped__
                raw = inspect.unwrap(raw)
            if matches(raw):
                found.append(raw)
    if not found:  # wrapped without __wrapped__, or kept only in a table
        found = [obj for obj in gc.get_objects() if matches(obj)]
    return found


def apply(mutant: dict[str, Any]) -> int:
    """Swap the mutated code into the target; the number of function objects changed."""
    target = mutant["target"]
    module = importlib.import_module(target["module"])
    filename = mutant["runtime_file"]
    qualname = target["qualname"]
    originals = _originals(module, qualname, filename)
    if not originals:
        raise RuntimeError(f"{target['module']}.{qualname} of {filename} not found")
    first = originals[0].__code__.co_firstlineno
    code = _compile(mutant["runtime_source"], qualname, filename, first)
    for fn in originals:
        if fn.__code__.co_freevars != code.co_freevars:
            raise RuntimeError(
                f"{qualname}: free variables differ ({fn.__code__.co_freevars} vs "
                f"{code.co_freevars})"
            )
        fn.__globals__.setdefault(PERTURB, perturb)
        fn.__code__ = code
    return len(originals)


class Recorder:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.log = Path(spec["log"])
        self.root = Path(spec["root"])
        self.skip = set(spec.get("skip") or ())
        only = spec.get("only")  # generic ids: the tests a map says reached the function
        self.only = set(only) if only is not None else None
        self.outcome: dict[str, str] = {}

    def write(self, record: dict[str, Any]) -> None:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        only = self.only

        def wanted(item: pytest.Item) -> bool:
            if item.nodeid in self.skip:
                return False
            return only is None or generic_test_id(item, self.root) in only

        if self.skip or only is not None:
            kept = [i for i in items if wanted(i)]
            config.hook.pytest_deselected(items=[i for i in items if not wanted(i)])
            items[:] = kept

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # a module the mutant broke at import: its tests count as failing
            self.write({"collect_error": report.nodeid.split("::", 1)[0]})

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        self.write({"start": item.nodeid, "test": generic_test_id(item, self.root)})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        now = self.outcome.get(report.nodeid, "passed")
        if report.failed:
            now = "failed"
        elif report.skipped and now != "failed":
            now = "skipped"  # a skip, an xfail
        self.outcome[report.nodeid] = now

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.write({"nodeid": nodeid, "outcome": self.outcome.pop(nodeid, "passed")})

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        types_ = sorted(PERTURBED["types"])  # type: ignore[call-overload]
        self.write({"perturbed": {**PERTURBED, "types": types_}})


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get("MUTATION_PLUGIN_SPEC")
    if not path:
        return
    spec = json.loads(Path(path).read_text())
    recorder = Recorder(spec)
    config.pluginmanager.register(recorder, "mutation-recorder")
    if spec.get("mutant"):
        try:
            recorder.write({"applied": apply(spec["mutant"])})
        except Exception as exc:  # the run must not pass as if the mutant did nothing
            recorder.write({"error": f"{type(exc).__name__}: {exc}"})
            raise pytest.UsageError(f"mutation not applied: {exc}") from exc
