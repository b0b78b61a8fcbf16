"""Fused elementwise programs lowered to numexpr expressions: the CPU engine's code generator.

`numexpr_source(program, in_dtypes)` is a pure function that turns a fused program
(`deepx_flow.ir.program`) into a `NumexprSource`: one or more stages, each one numexpr
expression, run in order by `fused_cpu`. A short chain is one stage, evaluated in one numexpr
call over the whole task. It returns None where numexpr cannot compute the program exactly as
NumPy does; the blocked evaluator of `fused_cpu` then runs it.

Exactness. Only dtypes numexpr computes as NumPy does are used (bool, int32, int64, float32,
float64). Every instruction is written with explicit conversions to the dtype NumPy's own loop
would use, and constants are typed 0-d arrays, never literals (numexpr reads a Python float
literal as float64, which would turn float32 programs into float64 ones). A final `cast` is
left to numexpr's output casting, so a float64 program may end in float16 (not in bfloat16:
programs with bfloat16 values run on the blocked path, in float32, see `kernels.bfloat16`).

Size. The generated text grows linearly with the program: an operand is written out in full
at most once. Several operators name their operand more than once (maximum spells out NumPy's
NaN rule, `where((a > b) | (a != a), a, b)`; relu and gelu repeat `a` too), and a value may be
read by several instructions; substituting a long sub-expression at each of those places made
the text grow about 4x per operator (201 M characters for 12 maxima). Here a value written out
more than once is copied only while its text is at most `INLINE_CHARS` long; a longer one ends
a stage, and later stages read its result by name: a temporary, not a copy. A stage also ends
where numexpr's limits would be passed (`MAX_EXPR_CHARS`, `MAX_EXPR_DEPTH`,
`MAX_NUMEXPR_OPERANDS`), so a program of any length lowers, in stages.

Generated code that numexpr then refuses is a code-generation failure (`CodegenError`, see
`fused_cpu`), except an operation numexpr has no kernel for, which is what the blocked path is
for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from deepx_flow.errors import ExecutionError
from deepx_flow.ir.program import Program, whole_axes
from deepx_flow.kernels import zero_ties
from deepx_flow.kernels.elementwise import COMPARISONS, GELU_C, GELU_K, OPS, constant

# Limits of one stage (one numexpr expression). Past 200 nested parentheses Python's parser,
# which numexpr compiles expressions with, gives up; NumPy's iterator takes at most 32 operands
# with NumPy 1.x (64 with NumPy 2), one of which is the output.
MAX_EXPR_CHARS = 20_000
MAX_EXPR_DEPTH = 120
MAX_NUMEXPR_OPERANDS = 31
# A value written out more than once is copied while its text is at most this long (`exp(x0)`,
# `(x0 * k1)`: numexpr computes the copies once again); a longer one becomes a stage's result.
INLINE_CHARS = 64

# dtype -> (numexpr signature type, numexpr result kind code)
NE_TYPES: dict[str, tuple[type, bytes]] = {
    "bool": (bool, b"b"), "int32": (np.int32, b"i"), "int64": (np.int64, b"l"),
    "float32": (float, b"f"), "float64": (np.float64, b"d"),
}
# Conversions numexpr does exactly like NumPy's astype; done as `x * one` so that -0.0, NaN and
# infinities pass through unchanged (`x + 0` would turn -0.0 into 0.0).
_WIDEN = {("int32", "int64"), ("int32", "float32"), ("int32", "float64"),
          ("int64", "float32"), ("int64", "float64"), ("float32", "float64")}
_INT = ("int32", "int64")
_FLOAT = ("float32", "float64")
_NE_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# op -> numexpr's function (float32 and float64 only)
_HYPERBOLIC = {"sinh": "sinh", "cosh": "cosh", "asinh": "arcsinh", "acosh": "arccosh",
               "atanh": "arctanh"}
_NE_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
_NAME = re.compile(r"\b[xks]\d+\b")  # x<k>: input k; k<i>: a constant; s<i>: stage i's result


@dataclass(frozen=True)
class NumexprStage:
    """One numexpr expression of a lowered program.

    `operands` lists, in signature order, where each variable comes from: `("in", k)` for the
    k-th input array, `("c", array)` for a typed 0-d constant, `("s", i)` for the result of
    stage `i` (an earlier one).
    """

    expression: str
    signature: tuple[tuple[str, type], ...]
    operands: tuple[tuple, ...]
    dtype: str  # what the expression computes

    @property
    def key(self) -> tuple:
        return (self.expression, tuple((n, t.__name__) for n, t in self.signature))


@dataclass(frozen=True)
class NumexprSource:
    """A program lowered to numexpr: stages run in order, the last one's result is the
    program's (cast to `out_dtype`, which differs when a final cast is left to numexpr)."""

    stages: tuple[NumexprStage, ...]
    out_dtype: str

    @property
    def chars(self) -> int:
        """Characters of generated code, all stages together."""
        return sum(len(s.expression) for s in self.stages)


def numexpr_source(program: Program, in_dtypes: tuple[str, ...]) -> NumexprSource | None:
    """Lower a program to numexpr stages, or None where numexpr cannot run it exactly.

    A pure function of the program and the dtypes of the task's input arrays; the generated
    text is at most a constant times the program's length (see the module docstring).
    """
    return _Lowering(tuple(in_dtypes)).lower(program)


class _Value(NamedTuple):
    """An instruction's result as numexpr text: the text, its dtype, its parenthesis depth,
    and the variables it reads."""

    text: str
    dtype: str
    depth: int
    names: frozenset


def _marker(i: int) -> str:
    """Where operand `i` goes in an instruction's template (text nothing else contains)."""
    return f"\x00{i}\x00"


def _fits(value: _Value) -> bool:
    return (len(value.text) <= MAX_EXPR_CHARS and value.depth <= MAX_EXPR_DEPTH
            and len(value.names) <= MAX_NUMEXPR_OPERANDS)


class _Lowering:
    """Turns a program into numexpr stages; `lower` returns None when it cannot."""

    def __init__(self, in_dtypes: tuple[str, ...]):
        self.in_dtypes = in_dtypes
        self.constants: dict[tuple[str, str], str] = {}  # (repr(value), dtype) -> name
        self.values: dict[str, np.ndarray] = {}
        self.stages: list[tuple[str, str]] = []  # (expression, dtype)

    def lower(self, program: Program) -> NumexprSource | None:
        if whole_axes(program):
            return None  # a softmax normalizes over a whole axis, numexpr sees one element
        # A final cast is left to numexpr's output casting (NumPy's astype rules), so programs
        # may end in any dtype, float16 and int8 included; not bfloat16, which NumPy's
        # casting rounds twice from float64 (`kernels.bfloat16`): such programs run blocked.
        final_cast = program[-1][0] == "cast" and len(program[-1][1]) == 1 \
            and program[-1][2] != "bfloat16"
        body = program[:-1] if final_cast else program
        result_arg = program[-1][1][0] if final_cast else ("t", len(body) - 1)
        live = _live(body, result_arg)

        # First pass: each instruction as a template with a marker per operand, and how often
        # each value will be written out (a template may name an operand several times).
        templates: list[str | None] = [None] * len(body)
        copies = [0] * len(body)
        for j, (op, args, dtype) in enumerate(body):
            if not live[j]:
                continue
            kinds = [self.dtype_of(a, body) for a in args]
            if dtype not in NE_TYPES or any(d not in NE_TYPES for d in kinds):
                return None
            template = self.instruction(op, [(_marker(i), d) for i, d in enumerate(kinds)],
                                        dtype)
            if template is None:
                return None
            templates[j] = template
            for i, a in enumerate(args):
                if a[0] == "t":
                    copies[a[1]] += template.count(_marker(i))
        if result_arg[0] == "t":
            copies[result_arg[1]] += 1

        # Second pass: fill the templates in, ending stages where a value is long and written
        # out more than once, or where numexpr's limits would be passed.
        values: list[_Value | None] = [None] * len(body)
        for j, (_, args, dtype) in enumerate(body):
            if not live[j]:
                continue
            operands = [self.ref(a, values) for a in args]
            value = _fill(templates[j], operands, dtype)
            while not _fits(value):
                compound = [i for i, o in enumerate(operands) if not _is_name(o)]
                if not compound:
                    return None  # one instruction alone passes the limits: not for numexpr
                i = max(compound, key=lambda i: (operands[i].depth, len(operands[i].text)))
                long, staged = operands[i], self.stage(operands[i])
                operands = [staged if o is long else o for o in operands]
                for a in args:  # later readers of that value read the stage's result too
                    if a[0] == "t" and values[a[1]] is long:
                        values[a[1]] = staged
                value = _fill(templates[j], operands, dtype)
            if copies[j] > 1 and len(value.text) > INLINE_CHARS:
                value = self.stage(value)
            values[j] = value
        result = self.ref(result_arg, values)
        if not (self.stages and result.text == f"s{len(self.stages) - 1}"):
            self.stage(result)  # the last stage computes the result (unless it already does)
        return self.finish(program[-1][2])

    def finish(self, out_dtype: str) -> NumexprSource | None:
        stages = []
        for expression, dtype in self.stages:
            names = sorted(set(_NAME.findall(expression)), key=lambda n: (n[0], int(n[1:])))
            signature, operands = [], []
            for n in names:
                index = int(n[1:])
                if n[0] == "x":
                    if self.in_dtypes[index] not in NE_TYPES:
                        return None  # read only by a final cast (float16 in): NumPy's job
                    signature.append((n, NE_TYPES[self.in_dtypes[index]][0]))
                    operands.append(("in", index))
                elif n[0] == "s":
                    signature.append((n, NE_TYPES[self.stages[index][1]][0]))
                    operands.append(("s", index))
                else:
                    value = self.values[n]
                    signature.append((n, NE_TYPES[value.dtype.name][0]))
                    operands.append(("c", value))
            stages.append(NumexprStage(expression, tuple(signature), tuple(operands), dtype))
        return NumexprSource(tuple(stages), out_dtype)

    def stage(self, value: _Value) -> _Value:
        """End a stage computing `value`; return the value as that stage's result."""
        name = f"s{len(self.stages)}"
        self.stages.append((value.text, value.dtype))
        return _Value(name, value.dtype, 0, frozenset((name,)))

    def dtype_of(self, arg, body) -> str:
        if arg[0] == "in":
            return self.in_dtypes[arg[1]]
        if arg[0] == "t":
            return body[arg[1]][2]
        if arg[0] == "c":
            return arg[2]
        raise ExecutionError(f"bad fused-program argument {arg!r}; expected ('in', k), "
                             "('t', j) or ('c', value, dtype)")

    def ref(self, arg, values) -> _Value:
        if arg[0] == "in":
            name = f"x{arg[1]}"
            return _Value(name, self.in_dtypes[arg[1]], 0, frozenset((name,)))
        if arg[0] == "t":
            return values[arg[1]]
        name = self.const(arg[1], arg[2])
        return _Value(name, arg[2], 0, frozenset((name,)))

    def const(self, value, dtype: str) -> str:
        key = (repr(value), dtype)
        name = self.constants.get(key)
        if name is None:
            name = self.constants[key] = f"k{len(self.constants)}"
            array = constant(value, dtype)
            array.flags.writeable = False  # shared by every call of the cached program
            self.values[name] = array
        return name

    def conv(self, operand: tuple[str, str], dst: str) -> str | None:
        """`operand` converted exactly (as NumPy's astype would) to `dst`, or None."""
        e, src = operand
        if src == dst:
            return e
        if dst == "bool":
            return f"({e} != {self.const(0, src)})"
        if src == "bool":  # numexpr has no bool-to-number casts except to int32
            return f"where({e}, {self.const(1, dst)}, {self.const(0, dst)})"
        if (src, dst) in _WIDEN:
            return f"({e} * {self.const(1, dst)})"
        return None  # narrowing (float64 -> float32, float -> int): only NumPy does it exactly

    def instruction(self, op: str, operands: list[tuple[str, str]], r: str) -> str | None:
        if op not in OPS:
            raise ExecutionError(f"unknown elementwise operator {op!r} in a fused program")
        if op == "cast":
            return self.conv(operands[0], r)
        if op in COMPARISONS:
            # NumPy compares in the promoted dtype of the operands.
            c = np.result_type(operands[0][1], operands[1][1]).name
            if c not in NE_TYPES:
                return None
            a, b = (self.conv(o, c) for o in operands)
            return None if a is None or b is None else f"({a} {_NE_COMPARE[op]} {b})"
        if op == "where":
            cond = operands[0]
            a, b = (self.conv(o, r) for o in operands[1:])
            if cond[1] != "bool" or a is None or b is None:
                return None
            return f"where({cond[0]}, {a}, {b})"
        # Every other operator computes in its result dtype, as NumPy's loop does.
        xs = [self.conv(o, r) for o in operands]
        if any(x is None for x in xs):
            return None
        return self.compute(op, xs, r)

    def compute(self, op: str, xs: list[str], r: str) -> str | None:
        a = xs[0]
        b = xs[1] if len(xs) > 1 else None
        k = self.const
        if r == "bool":
            # NumPy's bool loops: add is or, mul is and, maximum is or, minimum is and.
            table = {"abs": a, "floor": a, "ceil": a, "round": a,
                     "add": f"({a} | {b})", "mul": f"({a} & {b})",
                     "maximum": f"({a} | {b})", "minimum": f"({a} & {b})"}
            return table.get(op)
        if op in ("exp", "log", "sqrt", "tanh", "sigmoid", "gelu", "div", "pow", "sin", "cos",
                  "tan", "reciprocal", "softplus", *_HYPERBOLIC) and r not in _FLOAT:
            return None  # integer pow (NumPy raises for negative exponents) goes blocked
        if op in ("floor", "ceil", "round"):
            if r not in _FLOAT:
                return a  # integers are whole already
            # numexpr has floor and ceil in float32 and float64; its round is not rint
            return f"{op}({a})" if op != "round" else None
        if op == "sign":  # NaN (neither > 0 nor < 0) stays
            return (f"where({a} > {k(0, r)}, {k(1, r)}, where({a} < {k(0, r)}, {k(-1, r)}, "
                    f"where({a} != {a}, {a}, {k(0, r)})))")  # -0.0 -> +0.0, as NumPy
        if op == "reciprocal":
            return f"({k(1, r)} / {a})"
        if op == "softplus":  # logaddexp(0, x), as NumPy computes it
            return (f"(where({a} > {k(0, r)}, {a}, {k(0, r)}) + "
                    f"log1p(exp(-abs({a}))))")
        if op == "neg":
            return f"(-{a})"
        if op == "abs":
            # numexpr's abs turns integers into float64; spell it out for them.
            return f"abs({a})" if r in _FLOAT else f"where({a} < {k(0, r)}, -{a}, {a})"
        if op in ("exp", "log", "sqrt", "tanh", "sin", "cos", "tan"):
            return f"{op}({a})"
        if op in _HYPERBOLIC:
            return f"{_HYPERBOLIC[op]}({a})"
        if op == "sigmoid":
            return f"({k(1, r)} / ({k(1, r)} + exp(-{a})))"
        if op == "gelu":
            inner = f"(({a} + {k(GELU_C, r)} * ({a} * {a} * {a})) * {k(GELU_K, r)})"
            return f"(((tanh({inner}) + {k(1, r)}) * {a}) * {k(0.5, r)})"
        if op == "relu":  # maximum(a, 0), as NumPy's relu is
            op, b = "maximum", k(0, r)
        if op in _NE_ARITH:
            return f"({a} {_NE_ARITH[op]} {b})"
        if op in ("maximum", "minimum"):
            cmp = ">=" if op == "maximum" else "<="
            if r in _INT:
                return f"where({a} {cmp} {b}, {a}, {b})"
            # numexpr's own maximum/minimum propagate NaN but compute float32 in float64, so
            # spell out NumPy's rule: take a when it wins or is NaN, else b (NaN or not); and
            # between 0.0 and -0.0 the operand this machine's NumPy takes (`zero_ties`)
            tie = zero_ties.rule(op, r)
            if tie is None:
                return None
            cmp = cmp if tie == "first" else cmp[0]
            return f"where(({a} {cmp} {b}) | ({a} != {a}), {a}, {b})"
        return None


def _live(body: Program, result_arg) -> list[bool]:
    """Which instructions the result depends on (a program may compute values nobody reads)."""
    live = [False] * len(body)
    if result_arg[0] == "t":
        live[result_arg[1]] = True
    for j in reversed(range(len(body))):
        if live[j]:
            for a in body[j][1]:
                if a[0] == "t":
                    if not 0 <= a[1] < j:
                        raise ExecutionError(f"fused program instruction {j} reads temporary "
                                             f"{a[1]}, which is not computed before it")
                    live[a[1]] = True
    return live


def _is_name(value: _Value) -> bool:
    return value.depth == 0 and len(value.names) == 1 and value.text in value.names


def _fill(template: str, operands: list[_Value], dtype: str) -> _Value:
    """The template with each operand's text in place of its marker."""
    text = template
    names = set(_NAME.findall(template))
    for i, o in enumerate(operands):
        text = text.replace(_marker(i), o.text)
        names |= o.names
    # Each operand sits at most the template's depth deep: a bound, cheap to keep.
    depth = _depth(template) + max((o.depth for o in operands), default=0)
    return _Value(text, dtype, depth, frozenset(names))


def _depth(expression: str) -> int:
    depth = deepest = 0
    for ch in expression:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest
