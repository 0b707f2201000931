"""Backend profiles: how a device's tests are instantiated and how many may share it.

Every backend is a declaration (YAML, :mod:`reuse_specs.backend_schema`): the three that
ship with ci-relay in ``backend_declarations/``, and any number more from folders the caller
registers (:func:`add_backends_dir`): the relay's ``CI_RELAY_BACKENDS_DIR`` setting, its policy
file's ``backends_dir``, a shard child's copy. A team adds its device with a file, not code.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from reuse_specs.backend_schema import TOKEN, BackendDeclaration, RunnerImage
from reuse_specs.errors import SourceLocation, SpecError, SpecErrors
from reuse_specs.loader import validation_errors
from reuse_specs.yaml_source import YamlDocument, load_yaml

SPYRE_DEVICE_GLOB = "vfio/[0-9]*"  # where a Spyre card appears under /dev by default
BUNDLED_DECLARATIONS = Path(__file__).resolve().parent / "backend_declarations"
PACKAGES_ROOT = Path(__file__).resolve().parent.parent  # holds reuse_specs, spyre_emu, ...
PACKAGES_TOKEN = "${PACKAGES}"  # in a declaration's paths: ci-relay's installed packages
BACKENDS_DIR_ENV = "CI_RELAY_BACKENDS_DIR"  # the relay's setting (ci_relay.settings) naming one
RESERVED_ENV = ("TORCH_TEST_DEVICES", "PYTORCH_TESTING_DEVICE_ONLY_FOR")  # test_env's


@dataclass(frozen=True)
class RequiredModule:
    """A module the preflight imports, and where the declaration asks for it."""

    module: str
    message: str | None
    location: SourceLocation


@dataclass(frozen=True)
class RequiredDevices:
    """Devices that must exist under /dev (``setting``: the relay setting replacing glob)."""

    glob: str
    message: str | None
    setting: str | None
    location: SourceLocation


@dataclass(frozen=True)
class Backend:
    """A device the upstream tests run on.

    ``device_type`` is the name torch gives the device in instantiated test
    names (``cpu`` -> ``TestFooCPU.test_bar_cpu``); ``env`` is what PyTorch's
    test framework reads to pick that device; ``processes_per_device`` bounds
    parallel pytest processes on one device (0 = no bound). ``declaration`` is the
    file it came from and ``files`` the files that file names (they travel with it to a
    shard's runtime when it is not bundled).
    """

    name: str
    device_type: str
    description: str
    env: Mapping[str, str] = field(default_factory=dict)
    processes_per_device: int = 0
    env_defaults: Mapping[str, str] = field(default_factory=dict)  # unless already set
    fork_safe: bool = True
    modules: tuple[RequiredModule, ...] = ()
    devices: RequiredDevices | None = None
    test_devices_file: Path | None = None
    declaration: Path | None = None
    files: tuple[Path, ...] = ()
    image: RunnerImage = field(default_factory=RunnerImage)
    bundled: bool = False

    def apply_env(self, environ: MutableMapping[str, str]) -> None:
        """Set what PyTorch's test framework (and the device) read for this backend."""
        environ.update(self.env)
        for key, value in self.env_defaults.items():
            environ.setdefault(key, value)

    def check(self, device_glob: str | None = None) -> None:
        """Refuse clearly, before any test runs, when this machine cannot run the backend
        (``device_glob``: where its cards appear under /dev when the relay's settings say
        otherwise than the declaration)."""
        for required in self.modules:
            if not _importable(required.module):
                raise BackendUnavailable(
                    required.message
                    or f"the {self.name} backend needs the Python module {required.module!r}, "
                    f"which is not importable here (declared at {required.location})"
                )
        if self.devices is not None:
            pattern = device_glob or self.devices.glob
            if not any(Path("/dev").glob(pattern)):
                raise BackendUnavailable(
                    self.devices.message
                    or f"the {self.name} backend found no device /dev/{pattern} "
                    f"(declared at {self.devices.location})"
                )
        if self.test_devices_file is not None and not self.test_devices_file.is_file():
            raise BackendUnavailable(
                f"the {self.name} backend's TORCH_TEST_DEVICES file "
                f"{self.test_devices_file} does not exist (declared in {self.declaration})"
            )

    @property
    def class_suffix(self) -> str:
        """Suffix torch appends to a generic test class for this device."""
        return self.device_type.upper()


class BackendUnavailable(RuntimeError):
    pass


class DeclarationErrors(SpecErrors, ValueError):
    """Problems in backend declarations (a ValueError too, so a policy naming a backend
    reports them as its own validation error)."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        return False


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def _file_errors(
    doc: YamlDocument, decl: BackendDeclaration, folder: Path, bundled: bool
) -> tuple[list[SpecError], dict[str, Path], list[Path]]:
    """The files a declaration names, resolved against its folder (``${PACKAGES}/...``: in
    ci-relay's installed packages), and those of them that travel with it: a declaration
    that is not bundled names existing files inside its folder, or ci-relay's own."""
    named: dict[str, tuple[tuple[str | int, ...], str]] = {}
    if decl.test_env.torch_test_devices:
        raw = decl.test_env.torch_test_devices
        named["test_devices"] = (("test_env", "torch_test_devices"), raw)
    if decl.profile is not None:
        named["profile"] = (("profile", "file"), decl.profile.file)
    errors: list[SpecError] = []
    resolved: dict[str, Path] = {}
    travelling: list[Path] = []
    for key, (path, raw) in named.items():
        shipped = raw.startswith(PACKAGES_TOKEN + "/")
        if not shipped and TOKEN.search(raw):
            errors.append(
                SpecError(
                    doc.locate(path), f"{raw!r}: the only token a path may use is {PACKAGES_TOKEN}"
                )
            )
            continue
        target = (
            PACKAGES_ROOT / raw.removeprefix(PACKAGES_TOKEN + "/") if shipped else folder / raw
        ).resolve()
        resolved[key] = target
        if bundled or shipped:
            continue
        if not _inside(target, folder.resolve()):
            errors.append(
                SpecError(
                    doc.locate(path),
                    f"{raw!r} is outside the declaration's folder {folder}: a declaration "
                    "names only files beside or below it (they go with it to the runner), "
                    f"or ci-relay's own ({PACKAGES_TOKEN}/...)",
                )
            )
        elif not target.is_file():
            errors.append(SpecError(doc.locate(path), f"no such file {raw!r} (looked at {target})"))
        else:
            travelling.append(target)
    return errors, resolved, travelling


def _consistency_errors(doc: YamlDocument, decl: BackendDeclaration) -> list[SpecError]:
    """What the schema alone cannot say: reserved variables, image fields that exclude each
    other, ``${VAR}`` naming only the image's declared requirements."""
    errors = []
    for section in ("env", "env_defaults"):
        for key in getattr(decl, section):
            if key in RESERVED_ENV:
                errors.append(
                    SpecError(
                        doc.locate_key((section, key)),
                        f"{key} is set by test_env (torch_test_devices, device_only_for), "
                        f"not by {section}",
                    )
                )
    image = decl.image
    if image.from_backend is not None and image.base_image is not None:
        errors.append(
            SpecError(doc.locate(("image", "base_image")), "image: from_backend or base_image")
        )
    if image.debian_packages and (image.from_backend or image.base_image):
        errors.append(
            SpecError(
                doc.locate(("image", "debian_packages")),
                "debian_packages go into the shared Debian base: not with from_backend or "
                "base_image",
            )
        )
    if image.from_backend == decl.name:
        errors.append(
            SpecError(doc.locate(("image", "from_backend")), "an image cannot be its own base")
        )
    allowed = set(image.requires.env) if image.requires else set()
    for key in ("base_image", "wheels"):
        value = getattr(image, key) or ""
        for token in TOKEN.findall(value):
            if token not in allowed:
                errors.append(
                    SpecError(
                        doc.locate(("image", key)),
                        f"${{{token}}} is not one of image.requires.env "
                        f"({', '.join(sorted(allowed)) or 'none declared'}); a declaration "
                        "reads only the variables it declares",
                    )
                )
    return errors


def load_declaration(path: Path, bundled: bool = False) -> Backend:
    """One declaration file as a :class:`Backend`; raise :class:`DeclarationErrors` naming
    file:line:col for every problem found."""
    try:
        doc = load_yaml(path, str(path), expected="a backend declaration (name, device_type, ...)")
    except SpecErrors as exc:
        raise DeclarationErrors(exc.errors) from None
    if not isinstance(doc.data, dict):
        raise DeclarationErrors(
            [SpecError(doc.locate(()), "expected a mapping: a backend declaration")]
        )
    try:
        decl = BackendDeclaration.model_validate(doc.data)
    except ValidationError as exc:
        raise DeclarationErrors(validation_errors(exc, doc, BackendDeclaration)) from None
    folder = path.resolve().parent
    errors, files, travelling = _file_errors(doc, decl, folder, bundled)
    errors += _consistency_errors(doc, decl)
    if errors:
        raise DeclarationErrors(errors)
    env: dict[str, str] = {}
    if "test_devices" in files:
        env["TORCH_TEST_DEVICES"] = str(files["test_devices"])
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = decl.test_env.device_only_for
    env.update(decl.env)
    defaults = dict(decl.env_defaults)
    if decl.profile is not None:
        defaults.setdefault(decl.profile.env, str(files["profile"]))
    pre = decl.preflight
    modules = tuple(
        RequiredModule(m.module, m.message, doc.locate(("preflight", "modules", i)))
        for i, m in enumerate(pre.modules)
    )
    devices = (
        RequiredDevices(
            pre.devices.glob,
            pre.devices.message,
            pre.devices.setting,
            doc.locate(("preflight", "devices")),
        )
        if pre.devices
        else None
    )
    return Backend(
        name=decl.name,
        device_type=decl.device_type,
        description=decl.description,
        env=env,
        processes_per_device=decl.processes_per_device,
        env_defaults=defaults,
        fork_safe=decl.fork_safe,
        modules=modules,
        devices=devices,
        test_devices_file=files.get("test_devices"),
        declaration=path.resolve(),
        files=tuple(travelling),
        image=decl.image,
        bundled=bundled,
    )


def declaration_files(folder: Path) -> list[Path]:
    """The declarations of a folder: its ``*.yaml``/``*.yml`` files (not its sub-folders,
    which hold what they name)."""
    return sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


_extra_dirs: dict[Path, None] = {}


def add_backends_dir(folder: Path) -> None:
    """Declarations of ``folder`` join the registry of this process (a policy file's
    ``backends_dir``, a shard child's copy)."""
    _extra_dirs[folder.resolve()] = None


def remove_backends_dir(folder: Path) -> None:
    _extra_dirs.pop(folder.resolve(), None)


def backends_dirs() -> tuple[Path, ...]:
    """The folders of declarations beyond the bundled ones, in the order registered."""
    return tuple(_extra_dirs)


def _fingerprint(folders: tuple[Path, ...]) -> tuple[tuple[Path, tuple[tuple[str, int], ...]], ...]:
    """The folders with their declarations' names and change times: a changed file reloads."""
    out = []
    for folder in folders:
        files = declaration_files(folder) if folder.is_dir() else []
        out.append((folder, tuple((f.name, f.stat().st_mtime_ns) for f in files)))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _registry(key: tuple[tuple[Path, tuple[tuple[str, int], ...]], ...]) -> dict[str, Backend]:
    folders = [folder for folder, _files in key]
    found: dict[str, Backend] = {}
    errors: list[SpecError] = []
    sources = [(f, True) for f in declaration_files(BUNDLED_DECLARATIONS)]
    for folder in folders:
        if not folder.is_dir():
            where = SourceLocation(str(folder), 1, 1)
            why = f"no such folder of backend declarations ({BACKENDS_DIR_ENV} or a policy's)"
            errors.append(SpecError(where, why))
            continue
        sources += [(f, False) for f in declaration_files(folder)]
    for path, bundled in sources:
        try:
            backend = load_declaration(path, bundled)
        except DeclarationErrors as exc:
            errors += exc.errors
            continue
        first = found.get(backend.name)
        if first is not None:
            doc = load_yaml(path, str(path))
            what = "the bundled backend" if first.bundled else "the backend"
            errors.append(
                SpecError(
                    doc.locate(("name",)),
                    f"backend name {backend.name!r} clashes with {what} declared in "
                    f"{first.declaration}; choose another name",
                )
            )
            continue
        found[backend.name] = backend
    for backend in found.values():
        parent = backend.image.from_backend
        if parent is not None and parent not in found and backend.declaration is not None:
            doc = load_yaml(backend.declaration, str(backend.declaration))
            errors.append(
                SpecError(
                    doc.locate(("image", "from_backend")),
                    f"unknown backend {parent!r} (known: {', '.join(sorted(found))})",
                )
            )
    if errors:
        raise DeclarationErrors(errors)
    return found


class _Registry(Mapping[str, Backend]):
    """Every declared backend by name, read again when the folders of declarations change."""

    def _current(self) -> dict[str, Backend]:
        return _registry(_fingerprint(backends_dirs()))

    def __getitem__(self, name: str) -> Backend:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())


BACKENDS: Mapping[str, Backend] = _Registry()


class UnknownBackend(KeyError):
    def __str__(self) -> str:
        return f"unknown backend {self.args[0]!r} (known: {', '.join(sorted(BACKENDS))})"


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UnknownBackend(name) from None
