"""The chart's copies of contract facts (non-public ranges, the default catalog) are generated
from the contract, and a check fails when one drifts."""

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from sandpod_contract import chart_files
from sandpod_contract.catalog import DEFAULT_CATALOG_PATH
from sandpod_contract.non_public_ranges import NON_PUBLIC_RANGES
from sandpod_testkit.paths import REPO_ROOT

CHART = REPO_ROOT / "charts" / "sandpod"


@pytest.fixture
def chart(tmp_path: Path) -> Path:
    """A copy of the chart's generated files and what they are generated with."""
    copy = tmp_path / "chart"
    (copy / "files").mkdir(parents=True)
    for name in ("Chart.yaml", "values.yaml", "files/non-public-ranges.yaml"):
        shutil.copy(CHART / name, copy / name)
    return copy


def test_the_committed_chart_files_are_the_contracts() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "sandpod_contract.chart_files", "--check"],
        capture_output=True,
        text=True,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr


def test_the_chart_lists_the_contracts_non_public_ranges() -> None:
    listed = yaml.safe_load((CHART / "files" / "non-public-ranges.yaml").read_text())

    assert [(entry["cidr"], entry["what"]) for entry in listed] == list(NON_PUBLIC_RANGES)


def test_the_chart_catalog_is_the_contracts_with_short_image_names() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    contract = yaml.safe_load(DEFAULT_CATALOG_PATH.read_text())

    for name, language in contract["languages"].items():
        short = language["image"].removeprefix("localhost/sandpod/").removesuffix(":0.1.0")
        assert values["catalog"]["languages"][name] == {**language, "image": short}


@pytest.mark.parametrize(
    ("drifted_file", "edit"),
    [
        ("files/non-public-ranges.yaml", lambda text: text.replace('"10.0.0.0/8"', '"10.0.0.0/9"')),
        ("values.yaml", lambda text: text.replace("image: python\n", "image: python3\n")),
        ("values.yaml", lambda text: text.replace('      version: "24"\n', "")),
    ],
)
def test_check_names_a_drifted_file_and_generating_repairs_it(
    chart: Path,
    drifted_file: str,
    edit: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = chart / drifted_file
    original = path.read_text()
    path.write_text(edit(original))

    assert chart_files.main(["--check", "--chart", str(chart)]) == 1
    assert f"{path} drifted from the contract" in capsys.readouterr().err

    assert chart_files.main(["--chart", str(chart)]) == 0
    assert path.read_text() == original
    assert chart_files.main(["--check", "--chart", str(chart)]) == 0


def test_text_outside_the_generated_block_is_left_as_it_is(chart: Path) -> None:
    values = chart / "values.yaml"
    edited = values.read_text().replace('nameOverride: ""', "nameOverride: mine")
    values.write_text(edited)

    assert chart_files.main(["--check", "--chart", str(chart)]) == 0
    assert values.read_text() == edited


def test_an_image_from_elsewhere_is_written_in_full(chart: Path, tmp_path: Path) -> None:
    languages = (
        "languages:\n"
        "  ruby:\n"
        "    # from another registry\n"
        "    image: registry.other/tools/ruby:3.3\n"
        "    file: main.rb\n"
        "    command: [ruby, main.rb]\n"
        "\n"
        "  lua:\n"
        "    image: {lua_image}\n"
        "    file: main.lua\n"
        "    command: [lua, main.lua]\n"
    )
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("# a catalog\n" + languages.format(lua_image="localhost/sandpod/lua:0.1.0"))

    values = chart_files.generated_files(chart, catalog)[chart / "values.yaml"]

    # The same block under catalog:, only the chart's own image shortened.
    written = textwrap.indent(languages.format(lua_image="lua"), "  ")
    assert (chart_files.CATALOG_BEGIN + "catalog:\n" + written + chart_files.CATALOG_END) in values


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("localhost/sandpod/python:0.1.0", "python"),
        ("localhost/sandpod/python:0.2.0", "localhost/sandpod/python:0.2.0"),
        ("localhost/sandpod/team/python:0.1.0", "localhost/sandpod/team/python:0.1.0"),
        ("localhost/other/python:0.1.0", "localhost/other/python:0.1.0"),
    ],
)
def test_chart_image_is_short_only_when_the_chart_gives_it_back(image: str, expected: str) -> None:
    assert chart_files.chart_image(image, "localhost/sandpod", "0.1.0") == expected


def test_a_catalog_the_rewrite_cannot_follow_is_refused(chart: Path, tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "languages:\n  lua: {image: localhost/sandpod/lua:0.1.0, file: m.lua, command: [lua]}\n"
    )

    with pytest.raises(ValueError, match="on a line of its own"):
        chart_files.generated_files(chart, catalog)


def test_values_without_the_markers_are_refused(chart: Path) -> None:
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace(chart_files.CATALOG_END, ""))

    with pytest.raises(ValueError, match="marker lines"):
        chart_files.generated_files(chart)
