"""Backends are declarations (issue 36): the bundled three are YAML files with the behaviour
they had as code; a folder of declarations adds more; a wrong declaration is refused with
its file:line:col, and a backend whose preflight fails never runs on the CPU instead."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from ci_relay.execution.runner_image import render
from ci_relay.execution.shard import ShardRequest, _copy_declaration
from ci_relay.policy import PolicyError, load_policy
from reuse_specs.backend_schema import backend_json_schema
from reuse_specs.backends import (
    BACKENDS,
    BACKENDS_DIR_ENV,
    BUNDLED_DECLARATIONS,
    BackendUnavailable,
    DeclarationErrors,
    add_backends_dir,
    get_backend,
    remove_backends_dir,
)
from reuse_specs.bundled import BUNDLED_SPECS
from tests.conftest import CliResult

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_SCHEMA = ROOT / "reuse_specs" / "backend.schema.json"

TOY = """\
name: toydev
description: a toy device
device_type: toydev
test_env:
  torch_test_devices: toydev_test_base.py
  device_only_for: privateuse1
processes_per_device: 1
preflight:
  modules: [toydev_module_that_is_not_installed]
image:
  packages: [toydev]
  wheels: wheels
"""


@pytest.fixture
def declared(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Write a declaration (and the test-devices file it names) into a registered folder of
    declarations (what ``CI_RELAY_BACKENDS_DIR`` does); returns the declaration's path."""
    folder = tmp_path / "backends"
    folder.mkdir()
    (folder / "toydev_test_base.py").write_text("TEST_CLASS = None\n")
    add_backends_dir(folder)

    def write(text: str, name: str = "toydev.yaml") -> Path:
        path = folder / name
        path.write_text(textwrap.dedent(text))
        return path

    yield write
    remove_backends_dir(folder)


def _errors(path: Path) -> list[str]:
    with pytest.raises(DeclarationErrors) as info:
        dict(BACKENDS)
    return [str(e) for e in info.value.errors if e.location.file == str(path)]


def test_the_bundled_backends_are_as_they_were() -> None:
    cpu, emu, card = get_backend("cpu"), get_backend("spyre-emu"), get_backend("spyre")
    assert list(BACKENDS)[:3] == ["cpu", "spyre-emu", "spyre"]
    assert dict(cpu.env) == {"PYTORCH_TESTING_DEVICE_ONLY_FOR": "cpu"}
    assert (cpu.device_type, cpu.processes_per_device, cpu.fork_safe) == ("cpu", 0, True)
    assert dict(emu.env) == {
        "TORCH_TEST_DEVICES": str(ROOT / "spyre_emu" / "device_test_base.py"),
        "PYTORCH_TESTING_DEVICE_ONLY_FOR": "privateuse1",
    }
    assert (emu.device_type, emu.class_suffix, emu.processes_per_device) == ("spyre", "SPYRE", 1)
    assert card.env["TORCH_TEST_DEVICES"] == str(ROOT / "reuse_specs/devices/spyre_card.py")
    assert card.fork_safe is False and emu.fork_safe is True
    assert ShardRequest([], [], Path(), Path(), backend="spyre").restarts_in_process is False
    assert ShardRequest([], [], Path(), Path(), backend="spyre-emu").restarts_in_process is True
    with pytest.raises(BackendUnavailable) as info:
        card.check()  # no torch_spyre here
    assert str(info.value) == (
        "the spyre backend needs torch-spyre installed and a Spyre card "
        "(the runner image: ci-relay images build --backend spyre); "
        "without a card use --backend spyre-emu"
    )
    emu.check()
    cpu.check()


def test_the_card_preflight_names_a_missing_card(monkeypatch: pytest.MonkeyPatch) -> None:
    card = get_backend("spyre")
    monkeypatch.setattr("reuse_specs.backends._importable", lambda _module: True)
    with pytest.raises(BackendUnavailable) as info:
        card.check("no-such-device-[0-9]*")
    assert str(info.value) == (
        "the spyre backend found no Spyre card (no /dev/vfio device; "
        "CI_RELAY_SPYRE_DEVICE_GLOB names another pattern under /dev)"
    )
    card.check("null")  # /dev/null exists: the setting's pattern replaces the declared one


def test_the_shipped_schema_is_generated_and_every_bundled_declaration_names_it(
    cli: Callable[..., CliResult],
) -> None:
    result = cli("backends", "schema")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(SHIPPED_SCHEMA.read_text())
    assert json.loads(result.stdout) == backend_json_schema()  # regenerate: backends schema -o
    validator = Draft202012Validator(backend_json_schema())
    for path in sorted(BUNDLED_DECLARATIONS.glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert (path.parent / first.split("=", 1)[1]).resolve() == SHIPPED_SCHEMA
        assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == []


def test_a_folder_adds_a_backend(declared: Callable[[str], Path]) -> None:
    path = declared(TOY)
    toy = get_backend("toydev")
    assert not toy.bundled and toy.declaration == path.resolve()
    assert toy.class_suffix == "TOYDEV"
    assert toy.env["TORCH_TEST_DEVICES"] == str(path.parent.resolve() / "toydev_test_base.py")
    assert toy.files == (path.parent.resolve() / "toydev_test_base.py",)
    assert sorted(BACKENDS) == ["cpu", "spyre", "spyre-emu", "toydev"]


def test_a_declared_backend_travels_to_the_runtime_with_its_files(
    declared: Callable[[str], Path], tmp_path: Path
) -> None:
    declared(TOY)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    copy = _copy_declaration("toydev", scratch / "backend")
    assert copy is not None
    assert sorted(p.name for p in copy.iterdir()) == ["toydev.yaml", "toydev_test_base.py"]
    assert _copy_declaration("cpu", scratch / "bundled") is None  # ci-relay ships it


def test_a_missing_preflight_module_refuses_the_backend_naming_the_declaration(
    declared: Callable[[str], Path],
) -> None:
    path = declared(TOY)
    with pytest.raises(BackendUnavailable) as info:
        get_backend("toydev").check()
    assert str(info.value) == (
        "the toydev backend needs the Python module 'toydev_module_that_is_not_installed', "
        f"which is not importable here (declared at {path.resolve()}:9:13)"
    )


OUTSIDE = "/".join(("..", "elsewhere.py"))  # the folder's parent (spelt so: no path climbs here)
BAD = {
    "a wrong field": (
        TOY.replace("processes_per_device: 1", "processes_per_card: 1"),
        ":7:1: error: unknown key 'processes_per_card' in the document (expected one of: name,",
    ),
    "a device type that is not an identifier": (
        TOY.replace("device_type: toydev", "device_type: toy-dev"),
        ":3:14: error: device_type: device_type 'toy-dev' is not a valid lower-case Python "
        "identifier",
    ),
    "a name clash with a bundled backend": (
        TOY.replace("name: toydev", "name: spyre-emu"),
        ":1:7: error: backend name 'spyre-emu' clashes with the bundled backend declared in "
        f"{BUNDLED_DECLARATIONS / 'spyre-emu.yaml'}",
    ),
    "a test-devices file that does not exist": (
        TOY.replace("toydev_test_base.py", "nowhere.py"),
        ":5:23: error: no such file 'nowhere.py'",
    ),
    "a file outside the declaration's folder": (
        TOY.replace("toydev_test_base.py", OUTSIDE),
        f":5:23: error: {OUTSIDE!r} is outside the declaration's folder",
    ),
    "an environment variable the image does not declare": (
        TOY.replace("wheels: wheels", "wheels: ${HOME}/wheels"),
        ":12:11: error: ${HOME} is not one of image.requires.env (none declared)",
    ),
    "a reserved variable in env": (
        TOY + "env: {PYTORCH_TESTING_DEVICE_ONLY_FOR: cpu}\n",
        ":13:7: error: PYTORCH_TESTING_DEVICE_ONLY_FOR is set by test_env",
    ),
    "an image on an unknown backend": (
        TOY.replace("image:\n", "image:\n  from_backend: tpu\n"),
        ":11:17: error: unknown backend 'tpu'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_declaration_is_refused_at_its_line(
    declared: Callable[[str], Path], case: str
) -> None:
    text, expected = BAD[case]
    path = declared(text)
    errors = _errors(path)
    assert any(e.startswith(f"{path}{expected}") for e in errors), errors
    with pytest.raises(DeclarationErrors):
        get_backend("cpu")  # nothing runs while a declaration is wrong: not even the CPU


def test_the_cli_refuses_a_bad_declaration_and_never_runs_on_the_cpu(
    cli: Callable[..., CliResult], tmp_path: Path, sample_upstream_path: Path
) -> None:
    folder = tmp_path / "backends"
    folder.mkdir()
    (folder / "toydev_test_base.py").write_text("TEST_CLASS = None\n")
    (folder / "toydev.yaml").write_text(TOY.replace("device_type: toydev", "device_type: 1x"))
    env = {BACKENDS_DIR_ENV: str(folder)}
    checked = cli("backends", "check", folder)
    assert checked.code == 2
    assert f"{folder / 'toydev.yaml'}:3:14: error: device_type: device_type '1x'" in checked.output
    spec = BUNDLED_SPECS / "spyre_view_ops.yaml"
    args = ("run", "--spec", spec, "--upstream", sample_upstream_path, "--backend", "toydev")
    run = cli(*args, env=env)
    assert run.code == 2 and "error(s) in the backend declarations" in run.stderr
    assert "passed" not in run.stdout
    (folder / "toydev.yaml").write_text(TOY)  # valid, but its preflight module is missing
    run = cli(*args, env=env)
    assert run.code != 0
    assert "the toydev backend needs the Python module" in run.stderr
    assert f"{folder / 'toydev.yaml'}:9:13" in run.stderr.replace("\n", "")
    listed = cli("backends", "list", env=env)
    assert listed.code == 0 and "toydev" in listed.stdout


@pytest.fixture
def sample_upstream_path(sample_upstream: object) -> Path:
    return Path(sample_upstream.path)  # type: ignore[attr-defined]


@pytest.fixture
def policy_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "declared"
    yield folder
    remove_backends_dir(folder)


def test_a_policy_file_names_a_folder_of_declarations(tmp_path: Path, policy_dir: Path) -> None:
    policy_dir.mkdir()
    (policy_dir / "toydev_test_base.py").write_text("TEST_CLASS = None\n")
    (policy_dir / "toydev.yaml").write_text(TOY)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "backends_dir: declared\nrepositories:\n  a/b:\n    backends:\n      toydev: {level: L2}\n"
    )
    loaded = load_policy(policy)
    assert list(loaded.repositories["a/b"].backends) == ["toydev"]
    (policy_dir / "toydev.yaml").write_text(TOY.replace("name: toydev", "name: cpu"))
    with pytest.raises(PolicyError) as info:
        load_policy(policy)
    assert f"{policy_dir / 'toydev.yaml'}:1:7: error: backend name 'cpu' clashes" in str(info.value)


def test_every_runner_image_comes_from_one_template() -> None:
    template = (ROOT / "docker" / "runner.Containerfile").read_text()
    assert sorted(p.name for p in (ROOT / "docker").glob("runner*")) == ["runner.Containerfile"]
    cpu = render(template, "cpu", {"packages": ["torch==2.13.0", "scipy"]})
    assert "FROM ${BASE}" in cpu and "torch==2.13.0 scipy expecttest" in cpu
    assert not any(line.startswith("#@ ") for line in cpu.splitlines()[4:])
    assert "@PACKAGES@" not in cpu
    emu = render(template, "spyre-emu", {"from_backend": "cpu", "check": 'print("ok")\n'})
    assert "python3 -m venv" not in emu and "pip install" not in emu
    assert '"check", "print(\\"ok\\")\\n"]' in emu
    env = render(template, "toy", {"env": {"TOY_MODE": 'a "b"'}, "packages": ["toy"]})
    assert 'ENV TOY_MODE="a \\"b\\""' in env
