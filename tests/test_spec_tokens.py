"""``${TOKEN}`` in spec paths: an allowlist, never the environment (which holds secrets)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from reuse_specs import SpecErrors, load_specs
from tests.conftest import CliResult

SECRET_VALUE = "hunter2-webhook-secret"


def _spec(path: str) -> str:
    return f"""
        test_suite_config:
          files:
            - path: {path}
        """


@pytest.mark.parametrize(
    "token",
    ["${CI_RELAY_WEBHOOK_SECRET}", "$CI_RELAY_DISPATCH_TOKEN", "${HOME}", "${PATH}"],
)
def test_environment_variables_never_expand(
    token: str,
    write_spec: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("CI_RELAY_WEBHOOK_SECRET", "CI_RELAY_DISPATCH_TOKEN"):
        monkeypatch.setenv(name, SECRET_VALUE)
    spec = write_spec(_spec(f"{token}/test/test_x.py"))
    with pytest.raises(SpecErrors) as info:
        load_specs([spec], tmp_path)
    (error,) = info.value.errors
    text = str(error)
    name = token.strip("${}")
    assert f"unknown token ${{{name}}}" in text and "${TORCH_ROOT}, ${SPEC_DIR}, ${BACKEND}" in text
    assert text.startswith(f"{spec}:3:13: error:")  # file:line:col of the path value
    assert SECRET_VALUE not in text


def test_allowed_tokens_expand(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    upstream = tmp_path / "up"
    (upstream / "test").mkdir(parents=True)
    (upstream / "test" / "test_cpu.py").write_text("def test_a():\n    pass\n")
    spec = write_spec(_spec("${TORCH_ROOT}/test/test_${BACKEND}.py"), name="a.yaml")
    beside = tmp_path / "test_local.py"
    beside.write_text("def test_b():\n    pass\n")
    spec_dir = write_spec(_spec("${SPEC_DIR}/test_local.py"), name="b.yaml")
    loaded = load_specs([spec, spec_dir], upstream, backend="cpu")
    assert [f.resolved for f in loaded.files] == [
        [(upstream / "test" / "test_cpu.py").resolve()],
        [beside.resolve()],
    ]


def test_backend_token_without_a_backend_is_unresolved(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(_spec("${TORCH_ROOT}/test/test_${BACKEND}.py"))
    loaded = load_specs([spec], tmp_path)  # structure is fine; nothing to resolve against
    assert loaded.files[0].unresolved_token == "BACKEND" and loaded.files[0].resolved == []


def test_specs_check_names_the_bad_token(
    cli: Callable[..., CliResult], write_spec: Callable[..., Path]
) -> None:
    spec = write_spec(_spec("${CI_RELAY_WEBHOOK_SECRET}/t.py"))
    result = cli("specs", "check", spec, env={"CI_RELAY_WEBHOOK_SECRET": SECRET_VALUE})
    assert result.code == 1
    assert "unknown token ${CI_RELAY_WEBHOOK_SECRET}" in result.stdout
    assert SECRET_VALUE not in result.output
