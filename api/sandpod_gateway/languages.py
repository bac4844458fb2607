"""The languages executions can use, from the operator's catalog."""

from collections.abc import Iterable
from pathlib import Path

from sandpod_contract.catalog import load_catalog

from sandpod_gateway.schemas import LanguageInfo


class LanguageCatalog:
    def __init__(self, languages: Iterable[LanguageInfo]) -> None:
        self._languages = {language.name: language for language in languages}

    def names(self) -> list[str]:
        return sorted(self._languages)

    def get(self, name: str) -> LanguageInfo | None:
        return self._languages.get(name)

    def all(self) -> list[LanguageInfo]:
        return [self._languages[name] for name in self.names()]


def load_language_catalog(path: Path) -> LanguageCatalog:
    """The languages of an operator catalog file (the operator's own by default)."""
    return LanguageCatalog(
        LanguageInfo(
            name=name,
            version=language.version or None,
            description=language.description or None,
            lint=language.lint_command is not None,
            lint_rules=language.lint_rules if language.lint_command is not None else None,
            compiled=language.compile_command is not None,
        )
        for name, language in load_catalog(path).languages.items()
    )
