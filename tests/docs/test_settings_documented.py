"""The README's and the docs' `DEEPX_*` settings are the code's: every variable the code
reads is in the README's Settings section, every variable the docs name is one the code (or
the tests and benchmarks) reads, and every default they state is the code's default.

Nothing here is a list kept by hand: the variables are the `"DEEPX_..."` string literals of
the package's sources, and a stated default is checked by setting the variable to it: the
settings read then must equal the settings read with nothing set (and setting it to another
value must change them, so that a variable the settings ignore cannot pass)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deepx_flow.config import settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# The folders that install as deepx_flow (pyproject's package-dir).
PACKAGE = [ROOT / "deepx_flow", ROOT / "kernels", ROOT / "storage", ROOT / "ui"]
NAME = r"DEEPX_[A-Z0-9_]+"
# A number as the docs write one (1,000,000; 0.5) and the unit after it, if any.
NUMBER = r"(\d[\d,]*(?:\.\d+)?)\s*(KiB|MiB|GiB|ms|s)?\b"
UNITS = {None: 1, "s": 1, "ms": 1e-3, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
# Stated defaults: "`DEEPX_X` (4 MiB, ...)", "`DEEPX_MAX_TASKS` tasks (1,000,000)", and
# "every 5 s (`DEEPX_HEARTBEAT_S`)".
AFTER = re.compile(rf"`({NAME})`[^(`.;]{{0,12}}\({NUMBER}")
BEFORE = re.compile(rf"{NUMBER}\s*\(`?({NAME})`?")
TEXT_DEFAULT = re.compile(rf"`({NAME})` \([^()]*?default `([^`]+)`")


def read_by(folders) -> set[str]:
    """The DEEPX_ names that start a string literal in the Python files under `folders`:
    the names the code reads from the environment (and quotes in its messages)."""
    found = set()
    for folder in folders:
        for path in folder.rglob("*.py"):
            found |= set(re.findall(rf"""(?<=["'])({NAME})\b""", path.read_text()))
    return found


def flat(path: Path) -> str:
    return " ".join(path.read_text().split())


def settings_section() -> str:
    text = README.read_text()
    start = text.index("\n## Settings\n")
    end = text.find("\n## ", start + 1)
    return " ".join(text[start:end if end > 0 else None].split())


def stated_defaults() -> list[tuple[str, str, float]]:
    """(file, variable, value) for every numeric default the README and the docs state."""
    out = []
    for path in [README, *DOCS]:
        text = flat(path)
        for m in AFTER.finditer(text):
            out.append((path.name, m.group(1), _value(m.group(2), m.group(3))))
        for m in BEFORE.finditer(text):
            out.append((path.name, m.group(3), _value(m.group(1), m.group(2))))
    return out


def _value(number: str, unit: str | None) -> float:
    return float(number.replace(",", "")) * UNITS[unit]


@pytest.fixture
def no_settings(monkeypatch):
    """An environment with no DEEPX_ variable set."""
    import os
    for name in [n for n in os.environ if n.startswith("DEEPX_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_every_variable_the_code_reads_is_in_the_readmes_settings():
    section = settings_section()
    read = read_by(PACKAGE)
    assert "DEEPX_MEMORY_FRACTION" in read and "DEEPX_MAX_TASKS" in read  # the scan works
    missing = sorted(n for n in read if f"`{n}`" not in section)
    assert not missing, f"README.md's Settings section does not say what {missing} do"


def named_by_sdks() -> set[str]:
    """The DEEPX_ names the SDKs define that are no environment variable: the C API's
    status codes (`deepx.h`) and the C/C++ build's CMake options."""
    found = set()
    for path in [*(ROOT / "sdks").rglob("*.h"), *(ROOT / "sdks").rglob("CMakeLists.txt")]:
        found |= set(re.findall(NAME, path.read_text()))
    return found


def test_every_variable_the_docs_name_is_read_by_the_code():
    known = read_by(PACKAGE + [ROOT / "tests", ROOT / "benchmarks"]) | named_by_sdks()
    for path in [README, *DOCS, ROOT / "benchmarks" / "README.md"]:
        named = set(re.findall(NAME, path.read_text()))
        assert named <= known, f"{path.name} names {sorted(named - known)}, which nothing reads"


def test_the_stated_defaults_are_the_codes(no_settings):
    defaults = settings()
    stated = stated_defaults()
    named = {name for _, name, _ in stated}
    # What the README is known to state (the parse finds them).
    assert {"DEEPX_MEMORY_FRACTION", "DEEPX_CHUNKS_PER_THREAD", "DEEPX_MAX_TASKS",
            "DEEPX_HEARTBEAT_TIMEOUT_S"} <= named
    wrong = []
    for where, name, value in stated:
        text = f"{int(value)}" if value == int(value) else f"{value!r}"
        no_settings.setenv(name, text)
        if settings() != defaults:
            wrong.append(f"{where}: {name} ({text})")
        # Another value changes the settings: the stated one was checked, not ignored.
        no_settings.setenv(name, f"{int(value) // 2}" if value == int(value) else
                           f"{value / 2!r}")
        assert settings() != defaults, f"{name}: the settings do not read it"
        no_settings.delenv(name)
    assert not wrong, f"stated defaults that are not the code's: {wrong}"


def test_the_stated_paths_and_addresses_are_the_codes(no_settings, tmp_path):
    from deepx_flow.assets.root import asset_root
    from deepx_flow.meta.db import database_url
    no_settings.chdir(tmp_path)
    # The defaults that are worked out where they are used (relative to the working folder).
    worked_out = {"DEEPX_DB_URL": database_url, "DEEPX_ASSET_ROOT": asset_root}
    defaults = settings()
    stated = TEXT_DEFAULT.findall(settings_section())
    assert {name for name, _ in stated} >= {"DEEPX_DB_URL", "DEEPX_ASSET_ROOT"}
    for name, value in stated:
        if name in worked_out:
            scheme, _, path = value.rpartition("///")
            assert worked_out[name]() == (f"{scheme}///" if scheme else "") + \
                str(tmp_path / path), name
        else:
            no_settings.setenv(name, value)
            assert settings() == defaults, f"README.md: {name} (default {value})"
            no_settings.delenv(name)
