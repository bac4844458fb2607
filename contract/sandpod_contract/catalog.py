"""The language catalog: language name -> image, source file name, command."""

import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from sandpod_contract.models import LANGUAGE_PATTERN, RELATIVE_PATH_PATTERN, LintRules

DEFAULT_CATALOG_PATH = Path(__file__).with_name("catalog.yaml")


class Language(BaseModel):
    """How to run one language in its sandbox image."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    image: str = Field(min_length=1, description="Image with the runtime and sandpod-runner.")
    file: str = Field(pattern=RELATIVE_PATH_PATTERN, description="Name of the source file.")
    command: list[str] = Field(min_length=1, description="argv that runs the source file.")
    lint_command: list[str] | None = Field(
        default=None, min_length=1, description="argv of the linter (lint mode), if any."
    )
    lint_rules: LintRules | None = Field(
        default=None,
        description="The rules the linter checks unless an execution names its own, given to "
        "it as --select=… and --ignore=… (ruff's options); none: the linter's defaults.",
    )
    compile_command: list[str] | None = Field(
        default=None,
        min_length=1,
        description="argv that builds the source before `command` runs (run mode), if any; "
        "a failed build runs no program.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment.")
    version: str = Field(default="", description="Runtime version, for display.")
    description: str = Field(default="", description="One line for humans.")


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")

    languages: dict[str, Language] = Field(min_length=1)

    @field_validator("languages")
    @classmethod
    def _language_names(cls, languages: dict[str, Language]) -> dict[str, Language]:
        bad = [name for name in languages if re.fullmatch(LANGUAGE_PATTERN, name) is None]
        if bad:
            raise ValueError(f"language names must match {LANGUAGE_PATTERN}: {bad}")
        return languages


def load_catalog(path: Path = DEFAULT_CATALOG_PATH) -> Catalog:
    """Read and validate a catalog file; ValueError (pydantic's) when it is malformed."""
    with path.open() as stream:
        return Catalog.model_validate(yaml.safe_load(stream))


def builds(language: Language, mode: str) -> bool:
    """Whether a run of `language` in `mode` builds its source first (its compile step)."""
    return mode == "run" and language.compile_command is not None


def run_seconds(language: Language, mode: str, timeout_seconds: int, compile_seconds: int) -> int:
    """A run's time in seconds: the program's timeout, plus the build's own limit
    (`compile_seconds`) when it builds first. Every deadline of a run (the pod's
    activeDeadlineSeconds, the egress grant's lifetime, the operator's checks, the calls to
    a serving runner, a direct record's lost-after) is this plus that deadline's own margin;
    an interpreted language's is its timeout."""
    return timeout_seconds + (compile_seconds if builds(language, mode) else 0)
