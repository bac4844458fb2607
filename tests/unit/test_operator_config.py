from pathlib import Path

import pytest
from pydantic import ValidationError
from sandpod_contract.catalog import DEFAULT_CATALOG_PATH, load_catalog
from sandpod_operator.settings import OperatorSettings

pytestmark = pytest.mark.usefixtures("clean_environment")


def test_default_catalog_has_the_four_languages() -> None:
    catalog = load_catalog()
    assert set(catalog.languages) >= {"python", "javascript", "typescript", "bash"}
    python = catalog.languages["python"]
    assert python.image == "localhost/sandpod/python:0.1.0"
    assert python.file == "main.py"
    assert python.command == ["python3", "main.py"]
    assert python.lint_command is not None and python.lint_command[:2] == ["ruff", "check"]
    typescript = catalog.languages["typescript"]
    assert typescript.command[0] == "node" and typescript.command[-1] == "main.ts"
    assert typescript.lint_command is not None and typescript.lint_command[-1] == "main.ts"
    assert catalog.languages["bash"].lint_command is None


def test_catalog_refuses_bad_entries(tmp_path: Path) -> None:
    bad = tmp_path / "catalog.yaml"
    bad.write_text("languages:\n  Python:\n    image: x\n    file: main.py\n    command: [py]\n")
    with pytest.raises(ValidationError, match="language names"):
        load_catalog(bad)
    bad.write_text("languages:\n  py:\n    image: x\n    file: ../main.py\n    command: [py]\n")
    with pytest.raises(ValidationError):
        load_catalog(bad)


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SANDPOD_RUNTIME_CLASS_NAME", "kata")
    monkeypatch.setenv("SANDPOD_ALLOWED_RUNTIME_CLASSES", '["gvisor"]')
    monkeypatch.setenv("SANDPOD_MAX_MEMORY", "4Gi")
    monkeypatch.setenv("SANDPOD_CATALOG_PATH", str(tmp_path / "c.yaml"))
    settings = OperatorSettings()
    assert settings.runtime_class_name == "kata"
    assert settings.runtime_classes == {"kata", "gvisor"}
    assert settings.max_memory == "4Gi"
    assert settings.catalog_path == tmp_path / "c.yaml"


def test_settings_defaults() -> None:
    settings = OperatorSettings()
    assert settings.runtime_class_name == "gvisor"
    assert settings.catalog_path == DEFAULT_CATALOG_PATH
    assert settings.sandbox_uid == 65532
    assert settings.status_output_bytes == 64 * 1024
    assert settings.active_deadline_seconds_margin > settings.pod_startup_timeout_seconds


def test_settings_refuse_inconsistent_limits() -> None:
    with pytest.raises(ValidationError, match="default_memory must not exceed max_memory"):
        OperatorSettings(default_memory="4Gi", max_memory="1Gi")
    with pytest.raises(ValidationError, match="not a resource quantity"):
        OperatorSettings(max_cpu="two")
    with pytest.raises(ValidationError):
        OperatorSettings(max_timeout_seconds=301)
