"""Fused elementwise programs: the attribute that carries a chain of elementwise operators.

The fusion pass replaces a tree of elementwise nodes by one node whose `program` attribute
lists the operations, and whose inputs are the tensors the tree reads. A program is plain data
(tuples of str, int, float, bool), so a compiled graph can still be written out and hashed.

    program     = (instruction, ...)            # the last instruction's result is the output
    instruction = (op, args, dtype)             # op: an elementwise operator name; dtype: result
    arg         = ("in", k)                     # the k-th input array of the task
                | ("t", j)                      # the result of instruction j (j < this one)
                | ("c", value, dtype)           # a scalar constant of that dtype

Inputs broadcast against each other as in NumPy; the evaluator broadcasts the result to the
task's output shape (a program may read only small inputs, e.g. a broadcast bias). Every
engine must give the dtype each instruction names, as NumPy would.

Whole-axis instructions. `("softmax", (x, ("c", axis, "int64")), dtype)` and the same for
`log_softmax` normalize `x` along `axis` of the program's result space: the fuser puts a
softmax in the kernel of its users (the entropy `-(softmax(x) * log_softmax(x)).sum(1)` is one
task per chunk that writes nothing chunk-sized), so the axis is kept whole in every chunk of
the node that carries the program, and its engines compute at the full result shape, in blocks
that keep the axis whole. Softmax and log_softmax of one value along one axis share their
maximum and normalizer. Matmul epilogues hold none.
"""

from __future__ import annotations

from typing import Any

Arg = tuple
Instruction = tuple[str, tuple[Arg, ...], str]
Program = tuple[Instruction, ...]


def node_program(node) -> Program:
    """An elementwise node's program: its fused `program`, or its one operator reading its
    inputs in order."""
    return node.attr("program") or ((node.op, tuple(("in", i) for i in range(
        len(node.inputs))), node.dtype),)


def input_ref(k: int) -> Arg:
    return ("in", k)


def temp_ref(j: int) -> Arg:
    return ("t", j)


def const_ref(value: Any, dtype: str) -> Arg:
    return ("c", value, dtype)


# Instructions whose operator normalizes along an axis of the whole result (see above).
WHOLE_AXIS_OPS = frozenset({"softmax", "log_softmax"})


def whole_axis_ref(axis: int) -> Arg:
    return const_ref(int(axis), "int64")


def whole_axes(program: Program | None) -> tuple[int, ...]:
    """The axes a program's whole-axis instructions normalize along (sorted; () for none)."""
    return tuple(sorted({args[1][1] for op, args, _ in program or ()
                         if op in WHOLE_AXIS_OPS}))


# The longest formula `describe` writes out; explain tables and task labels show no more.
DESCRIBE_CHARS = 200


def describe(program: Program, max_chars: int = DESCRIBE_CHARS) -> str:
    """A one-line formula for explain tables, e.g. `relu(add(in0, 1.0))`.

    A formula longer than `max_chars` is cut there, ends in "..." and says how many
    instructions the program has. Only what the cut formula shows is written: the formula is
    built from the last instruction down, and every level writes at least two characters
    ("f("), so nothing deeper than `max_chars // 2` levels can show. The work stays bounded
    by the cut, not the program's length, even where a value is read twice at every step
    (written out in full, `t = t * t` ten thousand times would double ten thousand times).
    """
    if not program:
        return ""
    deepest = max_chars // 2
    texts: dict[tuple[int, int], str] = {}  # (instruction, depth) -> its text, cut

    def whole(i: int, depth: int) -> str:
        """Instruction i's formula, its operands' formulas cut."""
        op, args, _ = program[i]
        parts = []
        for a in args:
            if a[0] == "in":
                parts.append(f"in{a[1]}")
            elif a[0] != "t":
                parts.append(constant_text(a[1], a[2]))
            elif depth >= deepest:  # past what the cut formula can show
                parts.append("...")
            else:
                known = texts.get((a[1], depth + 1))
                if known is None:
                    full = whole(a[1], depth + 1)
                    known = texts[(a[1], depth + 1)] = (
                        full if len(full) <= max_chars else full[:max_chars - 3] + "...")
                parts.append(known)
        return f"{op}({', '.join(parts)})"

    formula = whole(len(program) - 1, 0)
    if len(formula) <= max_chars:
        return formula
    return f"{formula[:max_chars - 3]}... ({len(program):,} instructions)"


def operator_label(node) -> str:
    """What a task of `node` runs: its operator, a fused program, or an operator with the
    elementwise steps fused into it ("matmul+epilogue[relu(in0)]"). Task rows, measured
    speeds and error messages name operators this way."""
    attrs = dict(node.attrs)
    if node.op == "fused":
        return short_label(f"fused[{describe(attrs['program'])}]")
    for part in ("prologue", "epilogue"):
        if attrs.get(part):
            return short_label(f"{node.op}+{part}[{describe(attrs[part])}]")
    return node.op


def speed_label(node, inlined=()) -> str:
    """The label a task of `node` is measured under: its operator label, and the sources
    its tasks read inline ("sum+prologue[tanh(in0)] <- read_zarr"), since reading is part
    of their time."""
    inner = sorted({operator_label(i) for i in inlined})
    return operator_label(node) + (" <- " + ", ".join(inner) if inner else "")


def constant_text(value, dtype: str) -> str:
    """A program's constant as formulas show it: the shortest text that reads back as the
    same value of `dtype`, so `1 - 0.9` folded into a float32 program reads "0.1", the
    number the kernel computes with, not 0.09999999999999998 (NumPy's shortest repr; for
    bfloat16, whose text has six digits whatever its value, the fewest digits that read back
    as it). A value that is not one of `dtype` is shown as Python writes it."""
    import numpy as np
    try:
        typed = np.dtype(dtype).type(value)
    except (TypeError, ValueError, OverflowError):
        return repr(value)
    if np.dtype(dtype).kind == "f":
        # NumPy's shortest digits, positional or scientific, whichever is shorter: its str
        # writes float16 1001 as "1.001e+03" (Python writes "1001.0")
        return min(np.format_float_positional(typed, unique=True, trim="0"),
                   np.format_float_scientific(typed, unique=True, trim="-"), key=len)
    if np.dtype(dtype).kind != "V":  # integers and bools
        return str(typed)
    exact = float(typed)
    for digits in range(1, 18):  # 17 significant digits round-trip any float64
        text = f"{exact:.{digits}g}"
        if np.dtype(dtype).type(float(text)) == typed:
            return repr(float(text))  # "300.0", not "3e+02"
    return repr(exact)


def short_label(label: str, limit: int = 160) -> str:
    return label if len(label) <= limit else label[:limit - 3] + "..."
