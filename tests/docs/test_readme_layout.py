"""The README's Layout table is the repository's: a row for every folder at the top (but the
hidden ones), the `deepx_flow/` row names each of its subpackages, and the `examples/` row
names every example."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_rows() -> dict[str, str]:
    """Folder (as the table writes it, `examples/`) -> the rest of its row."""
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Layout\n")
    end = text.find("\n## ", start + 1)
    rows = {}
    for line in text[start:end if end > 0 else None].splitlines():
        m = re.match(r"\| `([^`]+/)` \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def tracked(folder: Path) -> list[Path]:
    """The files and folders right under `folder` that git tracks (not caches, build output
    or data a run left), or, outside a git checkout, what is there but the hidden ones."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=folder, check=True,
                                capture_output=True, text=True).stdout.split("\0")
        names = {name.split("/")[0] for name in listed if name}
    except (OSError, subprocess.CalledProcessError):
        names = {p.name for p in folder.iterdir() if p.name != "__pycache__"}
    return sorted(folder / n for n in names if not n.startswith("."))


def test_every_top_folder_has_a_row():
    folders = {f"{p.name}/" for p in tracked(ROOT) if p.is_dir()}
    assert {"deepx_flow/", "tests/"} <= folders
    assert folders - set(layout_rows()) == set(), "folders the README's Layout table omits"


def test_the_examples_row_names_every_example():
    row = layout_rows()["examples/"]
    examples = [p.name for p in tracked(ROOT / "examples") if p.suffix == ".py"]
    assert len(examples) >= 3
    assert [e for e in examples if f"`{e}`" not in row] == [], row


def test_the_package_row_names_every_subpackage():
    row = layout_rows()["deepx_flow/"]
    packages = [p.name for p in tracked(ROOT / "deepx_flow") if (p / "__init__.py").exists()]
    assert [p for p in packages if f"`{p}/`" not in row] == [], row
