"""A wheel holds every package of the source tree and the data files the code reads: each
folder with an __init__.py is listed in pyproject.toml's packages (an editable install finds
a missing one anyway, a wheel would not: `deepx-flow serve` once had neither its gateway nor
its serving package there), and the operator table is package data."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # (Python 3.11 and later)

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_for_the_wheel():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = setuptools["package-dir"]  # package -> folder, for those not under their name
    found = set()
    for package, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(ROOT / folder).parts
            name = ".".join((package,) + relative)
            # (a folder mapped elsewhere is listed under its own package name)
            if not any(str(init.parent).startswith(str(ROOT / f) + "/") or
                       init.parent == ROOT / f for p, f in folders.items()
                       if p != package and p.startswith(package + ".")):
                found.add(name)
    assert found == set(setuptools["packages"]), (
        f"missing: {sorted(found - set(setuptools['packages']))}, "
        f"listed but not found: {sorted(set(setuptools['packages']) - found)}")


def test_the_operator_table_is_package_data():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "operators.yaml" in setuptools["package-data"]["deepx_flow.ops"]
    assert (ROOT / "deepx_flow" / "ops" / "operators.yaml").is_file()
