"""Fuzz `deepx-flow explain` with seeded mutations of the example specs in graphs/*.yaml.

Run by tests/spec/test_spec_fuzz.py in a subprocess with a memory limit; it can also be run by
hand to reproduce a case:

    python tests/spec/fuzz_driver.py --seed 14 --cases 400 --workdir /tmp/fuzz [--only 123]

Each case takes one example spec, applies one to three mutations (deterministic for the seed
and the case number) to its parsed form or to its text, writes the result to
`<workdir>/case<N>.yaml`, and runs the command's own `main(["explain", ...])` in this process
with a per-case time limit. One JSON line per case goes to stdout as soon as the case ends
(so a case that hangs is known by the last line written): the case number, the mutations, the
exit code, what was printed on stderr, and the seconds it took.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import io
import json
import math
import random
import signal
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from deepx_flow.cli import main as cli_main  # noqa: E402
from deepx_flow.cli.main import main  # noqa: E402
from deepx_flow.ops import OPS  # noqa: E402

# The command's argument parser, built once: building it (about 12 ms, most of it argparse
# looking for translations of its help texts) took half of each case, and what is fuzzed is
# the spec, not the parser, which every case builds the same.
cli_main._parser = functools.cache(cli_main._parser)

SPECS = sorted((ROOT / "graphs").glob("*.yaml"))
CLUSTERS = [str(p) for p in sorted((ROOT / "graphs" / "clusters").glob("*.yaml"))]
OP_NAMES = sorted(OPS)
DTYPES = ["bool", "int8", "uint8", "int32", "int64", "uint64", "float16", "float32",
          "float64", "object", "float8", "complex64", "f4", "", "str"]
ATTRS = ["axes", "axis", "keepdims", "value", "seed", "mean", "std", "low", "high", "start",
         "step", "program", "epilogue", "prologue", "uri", "storage_chunks", "starts",
         "stops", "steps", "shape", "bogus"]
SCALARS = [0, 1, -1, 2, 3, 7, 64, 65, 127, 128, 255, 1000, 2**31, 2**53 + 1, 2**63 - 1,
           2**63, 2**64, 10**30, -10**30, 0.0, -0.0, 0.5, 1.5, -2.5, 1e-300, 1e300,
           math.inf, -math.inf, math.nan, True, False, None, "", "x", "w", "h", "nope",
           "in", "t", "c", "float32", "object", "a" * 300, "0", "1e5", "on", "null"]
CASE_SECONDS = 10


class CaseTimeout(BaseException):
    """A case ran past CASE_SECONDS. Not an Exception: the CLI's and libraries' `except
    Exception` must not take it for an ordinary failure (exit 1) and go on."""


def _value(rng: random.Random, depth: int = 0):
    """A random YAML value: mostly scalars, sometimes lists and mappings of them."""
    roll = rng.random()
    if roll < 0.6 or depth > 2:
        return rng.choice(SCALARS)
    if roll < 0.75:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if roll < 0.85:
        return [rng.choice(SCALARS[:12]) for _ in range(rng.randint(0, 70))]  # shapes, axes
    if roll < 0.95:
        return _program(rng)
    return {rng.choice(ATTRS): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _program(rng: random.Random):
    """A fused program, sometimes well formed, sometimes not."""
    instructions = []
    for j in range(rng.randint(0, 3)):
        op = rng.choice(OP_NAMES + ["frob"])
        args = []
        for _ in range(rng.randint(0, 3)):
            kind = rng.choice(["in", "t", "c", "q"])
            if kind == "c":
                args.append(["c", rng.choice(SCALARS[:30]), rng.choice(DTYPES)])
            else:
                args.append([kind, rng.choice([0, 1, 2, j, -1, 7, 1.5])])
        instructions.append([op, args, rng.choice(DTYPES[:9] + ["object"])])
    return instructions


def _paths(doc, prefix=()):
    """Every (container, key) in the document, to pick a place to mutate."""
    out = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.append((doc, key))
            out += _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out.append((doc, i))
            out += _paths(value, prefix + (i,))
    return out


def _nodes(doc) -> list[dict]:
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    return [n for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []


def _ids(doc) -> list:
    ids = [n.get("id") for n in _nodes(doc)]
    if isinstance(doc, dict) and isinstance(doc.get("inputs"), dict):
        ids += list(doc["inputs"])
    return ids or ["x"]


def mutate_doc(doc, rng: random.Random) -> str:
    """Apply one structural mutation to the parsed spec; return its description."""
    nodes = _nodes(doc)
    kind = rng.choice(["replace", "replace", "delete", "duplicate", "op", "op", "dtype",
                       "shape", "attr", "attr", "args", "literal", "output", "tweak", "tweak"])
    if kind == "tweak":
        # A small change to one number: most such specs stay valid, so compiling is fuzzed
        # as well as reading.
        numbers = [(c, k) for c, k in _paths(doc)
                   if isinstance(c[k], (int, float)) and not isinstance(c[k], bool)]
        if numbers:
            container, key = rng.choice(numbers)
            n = container[key]
            container[key] = rng.choice([0, 1, -1, n + 1, n - 1, -n, n * 2, n // 2 if
                                         isinstance(n, int) else n / 2, n * 10**6, n * 10**12])
            return f"tweak {key!r}: {n} -> {container[key]}"
        kind = "replace"
    if kind in ("op", "dtype", "shape", "attr", "args", "literal") and not nodes:
        kind = "replace"
    if kind == "replace":
        paths = _paths(doc)
        container, key = rng.choice(paths)
        container[key] = _value(rng)
        return f"replace {key!r}"
    if kind == "delete":
        container, key = rng.choice(_paths(doc))
        del container[key]
        return f"delete {key!r}"
    if kind == "duplicate":
        lists = [(c, k) for c, k in _paths(doc) if isinstance(c, list)]
        if not lists:
            return "duplicate nothing"
        container, key = rng.choice(lists)
        container.insert(key, container[key])
        return f"duplicate item {key}"
    if kind == "output":
        outputs = doc.get("outputs") if isinstance(doc, dict) else None
        if isinstance(outputs, list):
            outputs.append(rng.choice(_ids(doc) + ["nope", {"o": rng.choice(_ids(doc))}]))
        return "output"
    node = rng.choice(nodes)
    if kind == "op":
        same = [name for name in OP_NAMES if node.get("op") in OPS
                and OPS[name].kind == OPS[node["op"]].kind]
        node["op"] = rng.choice(same if same and rng.random() < 0.7 else OP_NAMES)
        return f"op {node['op']}"
    if kind == "dtype":
        node["dtype"] = rng.choice(DTYPES)
        return f"dtype {node['dtype']}"
    if kind == "shape":
        node["shape"] = rng.choice([[], [0], [3, 4], [2**40, 2**40], [2**62], [-1, 4],
                                    [1] * 65, [10**25], [2**20, 2**20, 2**20], [1.5, 2]])
        return f"shape of {len(node['shape'])} dims"
    if kind == "attr":
        attrs = node.setdefault("attrs", {}) if isinstance(node.get("attrs"), dict) or \
            "attrs" not in node else node["attrs"]
        name = rng.choice(ATTRS)
        if isinstance(attrs, dict):
            attrs[name] = _program(rng) if name in ("program", "epilogue", "prologue") \
                else _value(rng)
        return f"attr {name}"
    if kind == "args":
        node["args"] = [rng.choice(_ids(doc) + [rng.choice(SCALARS)])
                        for _ in range(rng.randint(0, 4))]
        return "args"
    if kind == "literal":
        args = node.get("args")
        if isinstance(args, list) and args:
            args[rng.randrange(len(args))] = rng.choice(SCALARS[:30])
        return "literal"
    return "nothing"


def mutate_text(text: str, rng: random.Random) -> tuple[str, str]:
    """Apply one mutation to the spec's text."""
    kind = rng.choice(["truncate", "chars", "chars", "nest", "alias", "bomb", "line"])
    if kind == "truncate":
        return text[:rng.randrange(len(text) + 1)], "truncate"
    if kind == "chars":
        chars = list(text)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(chars) + 1)
            what = rng.choice("[]{}&*:-,'\"\t\n #!|>?%@`\x00\u00e9\u2603 0123456789")
            if rng.random() < 0.5 and at < len(chars):
                chars[at] = what
            else:
                chars.insert(at, what)
        return "".join(chars), "chars"
    lines = text.splitlines()
    at = rng.randrange(len(lines) + 1)
    if kind == "nest":
        depth = rng.choice([10, 60, 70, 1000, 5000])
        lines.insert(at, "description: " + "[" * depth + "]" * depth)
        return "\n".join(lines), f"nest {depth}"
    if kind == "alias":
        lines.insert(at, "name: &self [*self]")
        return "\n".join(lines), "self alias"
    if kind == "bomb":
        bomb = ["description:", "  a0: &a0 [lol]"]
        for i in range(1, rng.choice([4, 8, 12])):
            bomb.append(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
        return "\n".join(bomb + lines), f"bomb {len(bomb) - 1}"
    if lines:
        lines.insert(at, lines[rng.randrange(len(lines))])
    return "\n".join(lines), "duplicate line"


@functools.cache
def _example(source: Path):
    """An example spec as `yaml.safe_load` gives it, read once: parsing it again for every
    case took as long as running the command on it."""
    return yaml.safe_load(source.read_text())


def make_case(seed: int, number: int) -> tuple[str, list[str], str]:
    """The text of case `number`, the mutations applied, and the cluster file to plan for."""
    rng = random.Random(seed * 1_000_003 + number)
    source = rng.choice(SPECS)
    doc = copy.deepcopy(_example(source))
    done = [source.stem]
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        done.append(mutate_doc(doc, rng))
    text = yaml.safe_dump(doc, sort_keys=False, width=1000)
    if rng.random() < 0.25:
        text, what = mutate_text(text, rng)
        done.append(what)
    return text, done, rng.choice(CLUSTERS)


def run_case(path: Path, cluster: str) -> tuple[int, str]:
    """Exit code and stderr of `deepx-flow explain` on the file, in this process."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(["explain", str(path), "--cluster", cluster])
        except SystemExit as exit_:  # argparse
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, err.getvalue()


def _alarm(signum, frame):
    raise CaseTimeout()


def run(seed: int, cases: int, workdir: Path, only: int | None = None) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGALRM, _alarm)
    for number in range(cases) if only is None else [only]:
        text, mutations, cluster = make_case(seed, number)
        path = workdir / f"case{number}.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        start = time.perf_counter()
        signal.alarm(CASE_SECONDS)
        try:
            code, stderr = run_case(path, cluster)
        except CaseTimeout:
            code, stderr = -1, f"timed out after {CASE_SECONDS} s"
        finally:
            signal.alarm(0)
        print(json.dumps({"case": number, "mutations": mutations, "rc": code,
                          "stderr": stderr[:2000], "stderr_chars": len(stderr),
                          "seconds": round(time.perf_counter() - start, 3)}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--only", type=int)
    options = parser.parse_args()
    run(options.seed, options.cases, options.workdir, options.only)
