"""The version reported everywhere is the one the package is built with."""

from __future__ import annotations

import tomllib
from pathlib import Path

import convmem
from convmem._version import __version__


def test_the_package_version_is_pyprojects() -> None:
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]
    assert convmem.__version__ == __version__
