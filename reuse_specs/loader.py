"""Load, validate and merge spec files into one :class:`LoadedSpec`.

Every problem in every file is collected before anything is reported, so a
maintainer fixes a spec in one pass rather than one error per run.
"""

from __future__ import annotations

import glob
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from reuse_specs.errors import SourceLocation, SpecError, SpecErrors
from reuse_specs.modes import Mode
from reuse_specs.op_forms import opinfo_forms
from reuse_specs.schema import (
    DtypeItem,
    GlobalConfig,
    SpecFile,
    SupportedModule,
    SupportedOp,
    TestEntry,
)
from reuse_specs.yaml_source import PathKey, YamlDocument, load_yaml

_TOKEN = re.compile(r"\$\{(\w+)\}|\$(\w+)")
# ``${NAME}`` in a spec path expands from these only, never from the environment (a
# worker's environment holds its secrets, and a spec must not be able to name them):
# the upstream checkout, the spec file's own folder, and the backend being run.
SPEC_TOKENS = ("TORCH_ROOT", "SPEC_DIR", "BACKEND")
_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class NamePattern:
    """One entry of a test's ``names`` list and where it was written."""

    text: str
    location: SourceLocation

    @property
    def class_part(self) -> str | None:
        return self.text.split("::")[0] if "::" in self.text else None

    @property
    def method_part(self) -> str:
        return self.text.split("::")[-1]

    @property
    def is_glob(self) -> bool:
        return bool(_GLOB_CHARS & set(self.text))


@dataclass(frozen=True)
class TestRule:
    """A ``tests:`` entry of a file, with the positions of its names."""

    __test__ = False

    entry: TestEntry
    names: tuple[NamePattern, ...]
    location: SourceLocation


@dataclass
class FileRules:
    """A ``files:`` entry: which upstream files it covers and the rules for them."""

    raw_path: str
    location: SourceLocation
    unlisted_test_mode: Mode
    labels: tuple[str, ...]
    rules: list[TestRule]
    global_config: GlobalConfig
    source: str
    resolved: list[Path] = field(default_factory=list)
    unresolved_token: str | None = None

    def supported_op(self, name: str) -> SupportedOp | None:
        """The entry for OpInfo ``name``: one naming it exactly, else one naming it in a
        short form (``gelu`` for ``nn.functional.gelu``, see :mod:`reuse_specs.op_forms`)."""
        ops = self.global_config.supported_ops or ()
        exact = next((o for o in ops if o.name == name), None)
        return exact or next((o for o in ops if name in opinfo_forms(o.name)), None)

    def supported_module(self, name: str) -> SupportedModule | None:
        mods = self.global_config.supported_modules
        wanted = name.removeprefix("torch.")
        return next((m for m in mods or () if m.name.removeprefix("torch.") == wanted), None)

    def supported_dtype(self, name: str) -> DtypeItem | None:
        return next((d for d in self.global_config.supported_dtypes if d.name == name), None)

    @property
    def is_glob(self) -> bool:
        return bool(_GLOB_CHARS & set(self.raw_path))


@dataclass
class LoadedSpec:
    """All spec files of one run, merged, with paths resolved against an upstream tree."""

    sources: list[str]
    files: list[FileRules]
    labels: tuple[str, ...]
    upstream: Path | None
    # input-generation keys ci-relay reads but cannot apply: (key, where it is written)
    opaque_inputs: list[tuple[str, SourceLocation]] = field(default_factory=list)

    def input_generation(self) -> tuple[list[str], list[str]]:
        """What the spec's input-generation keys do here: (applied, not applied), as lines
        for ``specs show`` and a run's summary."""
        seeds = {
            f"global.input_config.seed {r.global_config.input_config.seed} for {r.raw_path}: "
            "torch.manual_seed(seed) right before each test's body"
            for r in self.files
            if r.global_config.input_config.seed is not None
        }
        not_applied = [
            f"{key} at {where}: not applied (a Python callable or input list in torch-spyre's "
            "framework; the test uses PyTorch's own OpInfo/ModuleInfo sample inputs)"
            for key, where in self.opaque_inputs
        ]
        return sorted(seeds), not_applied

    def test_files(self) -> list[Path]:
        """Every upstream test file the spec covers, each once, in spec order."""
        seen: dict[Path, None] = {}
        for entry in self.files:
            for path in entry.resolved:
                seen.setdefault(path, None)
        return list(seen)

    @cached_property
    def _by_path(self) -> dict[Path, list[FileRules]]:
        index: dict[Path, list[FileRules]] = {}
        for entry in self.files:
            for path in entry.resolved:
                index.setdefault(path, []).append(entry)
        return index

    def rules_for(self, path: Path) -> list[FileRules]:
        """The ``files:`` entries covering an upstream file, in spec order."""
        found = self._by_path.get(path)
        return found if found is not None else self._by_path.get(path.resolve(), [])


def _dotted(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _field_type(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info.annotation
    return None


def _unwrap(tp: Any, want_list: bool) -> Any:
    """Reduce Annotated/Optional/Union/list annotations to the part a path step enters."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            lists = [a for a in args if typing.get_origin(a) is list]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            tp = (lists or models or args)[0] if want_list else (models or lists or args)[0]
        elif origin is list and want_list:
            return typing.get_args(tp)[0]
        else:
            return tp


def _expected_keys(path: Sequence[str | int], root: type[BaseModel] = SpecFile) -> list[str]:
    current: Any = root
    for part in path:
        current = _unwrap(current, want_list=isinstance(part, int))
        if isinstance(part, str):
            if not (isinstance(current, type) and issubclass(current, BaseModel)):
                return []
            current = _field_type(current, part)
    current = _unwrap(current, want_list=False)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [info.alias or name for name, info in current.model_fields.items()]
    return []


def _data_path(data: Any, loc: Sequence[str | int]) -> list[str | int]:
    """Drop pydantic's union/validator tags from a loc, keeping real data keys."""
    path: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        present = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        )
        if present:
            node = node[part]
            path.append(part)
        elif i == len(loc) - 1:
            path.append(part)
    return path


def validation_errors(
    exc: ValidationError, doc: YamlDocument, root: type[BaseModel] = SpecFile
) -> list[SpecError]:
    """Pydantic's errors for ``doc`` (validated as ``root``) at the file:line:col they name."""
    errors: list[SpecError] = []
    for err in exc.errors(include_url=False):
        path = _data_path(doc.data, err["loc"])
        kind = err["type"]
        where = _dotted(path)
        if kind == "extra_forbidden":
            expected = ", ".join(_expected_keys(path[:-1], root))
            message = f"unknown key {path[-1]!r} in {_dotted(path[:-1]) or 'the document'}"
            message += f" (expected one of: {expected})" if expected else ""
            errors.append(SpecError(doc.locate_key(tuple(path)), message))
            continue
        if kind == "missing":
            message = f"{_dotted(path[:-1]) or 'document'}: missing required key {path[-1]!r}"
            errors.append(SpecError(doc.locate(tuple(path[:-1])), message))
            continue
        msg = str(err["msg"]).removeprefix("Value error, ")
        if kind not in ("value_error",):
            msg = f"{msg} (got {err.get('input')!r:.80})"
        errors.append(SpecError(doc.locate(tuple(path)), f"{where}: {msg}"))
    return errors


def _resolve_tokens(raw: str, tokens: Mapping[str, str]) -> tuple[str | None, str | None]:
    missing: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in tokens:
            return tokens[name]
        missing.append(name)
        return match.group(0)

    expanded = _TOKEN.sub(substitute, raw)
    return (None, missing[0]) if missing else (expanded, None)


def _resolve_paths(raw: str, tokens: Mapping[str, str]) -> tuple[list[Path], str | None]:
    expanded, missing = _resolve_tokens(raw, tokens)
    if expanded is None:
        return [], missing
    if _GLOB_CHARS & set(expanded):
        return sorted(Path(p).resolve() for p in glob.glob(expanded, recursive=True)), None
    path = Path(expanded)
    return ([path.resolve()] if path.is_file() else []), None


def _unknown_tokens(doc: YamlDocument, spec: SpecFile) -> list[SpecError]:
    errors = []
    for i, entry in enumerate(spec.test_suite_config.files):
        for match in _TOKEN.finditer(entry.path):
            name = match.group(1) or match.group(2)
            if name not in SPEC_TOKENS:
                errors.append(
                    SpecError(
                        doc.locate(("test_suite_config", "files", i, "path")),
                        f"unknown token ${{{name}}} in path {entry.path!r}: paths may use "
                        + ", ".join(f"${{{t}}}" for t in SPEC_TOKENS)
                        + " (never the environment)",
                    )
                )
    return errors


def _file_rules(doc: YamlDocument, spec: SpecFile, tokens: Mapping[str, str]) -> list[FileRules]:
    suite = spec.test_suite_config
    out: list[FileRules] = []
    for i, entry in enumerate(suite.files):
        base: PathKey = ("test_suite_config", "files", i)
        rules = []
        for j, test in enumerate(entry.tests):
            names_key = (*base, "tests", j, "names")
            patterns = tuple(
                NamePattern(name, doc.locate((*names_key, k))) for k, name in enumerate(test.names)
            )
            rules.append(TestRule(test, patterns, doc.locate((*base, "tests", j))))
        resolved, missing = _resolve_paths(entry.path, tokens)
        out.append(
            FileRules(
                raw_path=entry.path,
                location=doc.locate((*base, "path")),
                unlisted_test_mode=entry.unlisted_test_mode,
                labels=tuple(entry.labels or suite.labels),
                rules=rules,
                global_config=suite.global_,
                source=doc.file,
                resolved=resolved,
                unresolved_token=missing,
            )
        )
    return out


OPAQUE_INPUT_KEYS = ("sample_inputs_func", "constructor_inputs", "forward_inputs")


def _opaque_locations(doc: YamlDocument) -> list[tuple[str, SourceLocation]]:
    return [
        (str(path[-1]), doc.locate_key(path))
        for path in doc.key_marks
        if path and path[-1] in OPAQUE_INPUT_KEYS
    ]


def _conflicting_globals(files: list[FileRules]) -> list[SpecError]:
    """Two spec files covering one upstream file must agree on their ``global`` section."""
    errors: list[SpecError] = []
    owner: dict[Path, FileRules] = {}
    for entry in files:
        for path in entry.resolved:
            first = owner.setdefault(path, entry)
            if first.source != entry.source and first.global_config != entry.global_config:
                errors.append(
                    SpecError(
                        entry.location,
                        f"{path} is also covered by {first.source} ({first.location}) "
                        "whose global section differs; a test file gets one global section",
                    )
                )
    return errors


def _conflicting_modes(files: list[FileRules]) -> list[SpecError]:
    """The same test name given two different modes for the same upstream file."""
    errors: list[SpecError] = []
    seen: dict[tuple[str, str], tuple[Mode, SourceLocation]] = {}
    for entry in files:
        keys = [str(p) for p in entry.resolved] or [entry.raw_path]
        for rule in entry.rules:
            for pattern in rule.names:
                for key in keys:
                    first = seen.setdefault(
                        (key, pattern.text), (rule.entry.mode, pattern.location)
                    )
                    if first[0] != rule.entry.mode:
                        errors.append(
                            SpecError(
                                pattern.location,
                                f"{pattern.text!r} is listed with mode {rule.entry.mode.value} "
                                f"here but {first[0].value} at {first[1]}",
                            )
                        )
                        break
    return errors


def spec_tokens(
    upstream: Path | None, spec_file: Path | None = None, backend: str | None = None
) -> dict[str, str]:
    """Values for ``${TOKEN}`` in one spec file's paths (:data:`SPEC_TOKENS`, no others)."""
    tokens: dict[str, str] = {}
    if upstream is not None:
        tokens["TORCH_ROOT"] = str(upstream.resolve())
    if spec_file is not None:
        tokens["SPEC_DIR"] = str(spec_file.resolve().parent)
    if backend is not None:
        tokens["BACKEND"] = backend
    return tokens


def load_specs(
    paths: Sequence[Path], upstream: Path | None = None, backend: str | None = None
) -> LoadedSpec:
    """Read and merge spec files; raise :class:`SpecErrors` listing every problem.

    Structure and values are always checked. Paths are resolved when an
    upstream tree is given (or ``TORCH_ROOT`` is set); checking them against
    that tree is :func:`reuse_specs.upstream_check.check_against_upstream`.
    ``backend`` fills ``${BACKEND}``.
    """
    if upstream is None and os.environ.get("TORCH_ROOT"):  # torch-spyre's convention
        upstream = Path(os.environ["TORCH_ROOT"])
    errors: list[SpecError] = []
    files: list[FileRules] = []
    labels: dict[str, None] = {}
    opaque: list[tuple[str, SourceLocation]] = []
    sources: list[str] = []
    for path in paths:
        sources.append(str(path))
        try:
            doc = load_yaml(path, str(path))
        except SpecErrors as exc:
            errors.extend(exc.errors)
            continue
        if not isinstance(doc.data, dict):
            errors.append(
                SpecError(doc.locate(()), "expected a mapping with the key 'test_suite_config'")
            )
            continue
        try:
            spec = SpecFile.model_validate(doc.data)
        except ValidationError as exc:
            errors.extend(validation_errors(exc, doc))
            continue
        unknown = _unknown_tokens(doc, spec)
        if unknown:
            errors.extend(unknown)
            continue
        files.extend(_file_rules(doc, spec, spec_tokens(upstream, Path(path), backend)))
        labels.update(dict.fromkeys(spec.test_suite_config.labels))
        opaque.extend(_opaque_locations(doc))
    errors.extend(_conflicting_globals(files))
    errors.extend(_conflicting_modes(files))
    if errors:
        raise SpecErrors(errors)
    return LoadedSpec(
        sources=sources,
        files=files,
        labels=tuple(labels),
        upstream=upstream.resolve() if upstream else None,
        opaque_inputs=opaque,
    )
