"""Operator registration: built-in operators and those of third-party engines.

The built-in operators are `deepx_flow.ops.OPS`. A third-party package adds operators through
an entry point in the group `deepx_flow.kernels`, e.g. in its `pyproject.toml`:

    [project.entry-points."deepx_flow.kernels"]
    my_engine = "my_engine.deepx:operators"

The object the entry point names is either a list (or tuple) of `deepx_flow.ops.OpSpec`, or
a callable taking no arguments that returns an iterable of them:

    from deepx_flow.ops import ELEMENTWISE, OpSpec

    def same_as_input(node, inputs):          # the type rule: output shape and dtype
        return inputs[0].shape, inputs[0].dtype

    def operators():
        return [OpSpec("softplus", ELEMENTWISE, 1, same_as_input, engines=("my_engine",),
                       flops_per_element=4, doc="log(1 + exp(x))")]

Each operator is registered with its engines and cost model (`flops_per_element`,
`temp_bytes_per_element`) and, as its source, the name of the distribution that declared
the entry point. An entry point that fails to load, or gives anything but OpSpecs, adds
nothing and gives one RuntimeWarning naming it; an operator whose name is taken (a built-in
or an earlier entry point's) is skipped with a warning.

`deepx-flow ops` lists all of them; `register_operators(db)` writes them to the `operators`
table. Third-party operators are registered and listed only: the compiler, the YAML reader
and the kernels still use the built-in table, so graphs cannot use them yet.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from deepx_flow.ops import OPS, OpSpec

ENTRY_POINT_GROUP = "deepx_flow.kernels"
BUILTIN = "builtin"


@dataclass(frozen=True)
class RegisteredOperator:
    spec: OpSpec
    source: str  # "builtin", or the distribution that registered it through an entry point


def third_party_operators() -> list[RegisteredOperator]:
    """Operators from the `deepx_flow.kernels` entry points (warns about broken ones)."""
    taken = set(OPS)
    found = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        source = ep.dist.name if ep.dist is not None else ep.value.partition(":")[0]
        specs = _load(ep, source)
        for spec in specs or ():
            if spec.name in taken:
                _warn(ep, source, f"operator '{spec.name}' is already registered; skipped")
                continue
            taken.add(spec.name)
            found.append(RegisteredOperator(spec, source))
    return found


def _load(ep: EntryPoint, source: str) -> list[OpSpec] | None:
    try:
        obj = ep.load()
        specs = list(obj() if callable(obj) else obj)
    except Exception as err:  # any failure in third-party code: warn, do not crash
        _warn(ep, source, f"failed to load: {type(err).__name__}: {err}")
        return None
    wrong = [s for s in specs if not isinstance(s, OpSpec)]
    if wrong:
        _warn(ep, source, f"gave {type(wrong[0]).__name__} where deepx_flow.ops.OpSpec was "
                          f"expected; none of its operators registered")
        return None
    return specs


def _warn(ep: EntryPoint, source: str, message: str) -> None:
    warnings.warn(f"deepx_flow.kernels entry point '{ep.name} = {ep.value}' (from {source}): "
                  f"{message}", RuntimeWarning, stacklevel=4)


def registered_operators() -> list[RegisteredOperator]:
    """Built-in and third-party operators, by kind and name."""
    builtin = [RegisteredOperator(spec, BUILTIN) for spec in OPS.values()]
    return sorted(builtin + third_party_operators(),
                  key=lambda r: (r.spec.kind, r.spec.name))


def operators() -> list[OpSpec]:
    return [r.spec for r in registered_operators()]


def register_operators(db=None) -> list[RegisteredOperator]:
    """Upsert every registered operator into the `operators` table of `db` (default:
    `open_db()`); return them."""
    from deepx_flow.meta.models import Operator
    if db is None:
        from deepx_flow.meta import open_db
        db = open_db()
    registered = registered_operators()
    now = time.time()
    with db.session() as session:
        for r in registered:
            row = session.get(Operator, r.spec.name) or Operator(name=r.spec.name, kind="",
                                                                 engines="", fusable=False,
                                                                 flops_per_element=0,
                                                                 temp_bytes_per_element=0,
                                                                 registered_at=now)
            row.kind, row.engines, row.fusable = r.spec.kind, ",".join(r.spec.engines), \
                r.spec.fusable
            row.flops_per_element = r.spec.flops_per_element
            row.temp_bytes_per_element = r.spec.temp_bytes_per_element
            row.source, row.doc, row.registered_at = r.source, r.spec.doc, now
            session.add(row)
    return registered


def installed_engines() -> set[str]:
    """The engines this machine can run: NumPy always, CuPy when it is installed (a
    machine without it runs no GPU kernel), and every third-party engine, which is here
    because its package registered it."""
    import importlib.util
    engines = {e for r in registered_operators() for e in r.spec.engines}
    if importlib.util.find_spec("cupy") is None:
        engines.discard("cupy")
    return engines


def engines_here(spec: OpSpec, installed: set[str]) -> str:
    """The engines of `spec` this machine has, as `deepx-flow ops` and the dashboard list
    them ("none here" when it has none of them)."""
    return ",".join(e for e in spec.engines if e in installed) or "none here"


def engine_notes(registered: list[RegisteredOperator], installed: set[str]) -> list[str]:
    """A line for each engine that operators have kernels for but this machine has not."""
    missing: dict[str, int] = {}
    for r in registered:
        for engine in r.spec.engines:
            if engine not in installed:
                missing[engine] = missing.get(engine, 0) + 1
    return [f"{engine}: {count} operators have kernels for it, but it is not installed here"
            + (" (GPU workers need `pip install deepx-flow[gpu]`)" if engine == "cupy" else "")
            for engine, count in sorted(missing.items())]


def operator_table(registered: list[RegisteredOperator] | None = None,
                   installed: set[str] | None = None) -> str:
    """The operators, with the engines of each that this machine has (`installed`;
    default `installed_engines()`), and a line for each engine it has not."""
    from deepx_flow.text_table import text_table
    registered = registered if registered is not None else registered_operators()
    installed = installed_engines() if installed is None else installed
    rows = [(r.spec.name, r.spec.kind, engines_here(r.spec, installed),
             "yes" if r.spec.fusable else "no", f"{r.spec.flops_per_element:g}",
             f"{r.spec.temp_bytes_per_element:g}", r.source, r.spec.doc)
            for r in registered]
    table = text_table(("operator", "kind", "engines", "fuses", "flops/elem",
                        "scratch B/elem", "source", "description"), rows)
    return "\n".join([table, *engine_notes(registered, installed)])
