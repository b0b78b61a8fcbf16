"""Write every SDK's operator functions from the operator table
(`deepx_flow/ops/operators.yaml`), so that no language lacks an operator another has.

    python sdks/generate.py          # write them
    python sdks/generate.py --check  # exit 1 (naming the files) where they are not current
    python sdks/generate.py --out DIR  # write them into DIR, a copy of sdks/

Each language's generator is one module of `sdks/generators/` (all but `common`), whose
`files()` gives its generated files (path under sdks/ -> text); a new language is a new
module. With DEEPX_EXTRA_OPERATORS naming a table of composites, they are written too: adding
an operator to the table and generating is all an SDK needs (tests/sdks/test_extra_operator.py).

The tests run the check (tests/sdks/test_generated.py): a table changed without
regenerating fails CI. Generated files are never edited by hand.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))


def languages() -> list[str]:
    """The languages with a generator (the modules of sdks/generators/ but `common`)."""
    return sorted(m.name for m in pkgutil.iter_modules([str(ROOT / "generators")])
                  if m.name != "common")


def generated() -> dict[str, str]:
    """Every generated file (path under sdks/ -> text)."""
    out = {}
    for language in languages():
        out.update(importlib.import_module(f"generators.{language}").files())
    return out


def main(argv: list[str]) -> int:
    # --out DIR: write under DIR (a copy of sdks/) instead of here
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else ROOT
    stale = []
    for path, text in generated().items():
        target = out / path
        if "--check" in argv:
            if not target.is_file() or target.read_text() != text:
                stale.append(path)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if stale:
        print("not current (run python sdks/generate.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
