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
"""

from __future__ import annotations

from typing import Any

Arg = tuple
Instruction = tuple[str, tuple[Arg, ...], str]
Program = tuple[Instruction, ...]


def input_ref(k: int) -> Arg:
    return ("in", k)


def temp_ref(j: int) -> Arg:
    return ("t", j)


def const_ref(value: Any, dtype: str) -> Arg:
    return ("c", value, dtype)


def describe(program: Program) -> str:
    """A one-line formula for explain tables, e.g. `relu(add(in0, 1.0))`."""
    exprs: list[str] = []
    for op, args, _ in program:
        parts = []
        for a in args:
            parts.append(f"in{a[1]}" if a[0] == "in" else exprs[a[1]] if a[0] == "t" else
                         repr(a[1]))
        exprs.append(f"{op}({', '.join(parts)})")
    return exprs[-1] if exprs else ""
