"""The SDK's functions that are not operators, as `deepx-flow ops` lists them.

`dx.argmax`, `dx.clip`, `dx.pad`, `dx.nn.layer_norm`, `dx.random.normal`, ... build their
graphs from the operators (`deepx_flow.ops.OPS`); a user looks for them by the function's
name, which is often not an operator's. They are found here, not kept in a list: the public
functions of `dx`, `dx.nn` and `dx.random` that return tensors, less those that are an
operator's own builder (`deepx_flow.sdk.functions.<op>` for each operator `op`). So a
function that becomes an operator leaves this list by itself, and a new one joins it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType


# The longest description a row shows: the table stays readable in a terminal.
SUMMARY_CHARS = 100


@dataclass(frozen=True)
class Function:
    name: str          # as it is called: "dx.nn.layer_norm"
    arguments: str     # "(x, scale, bias, axis=-1, eps=1e-05)"
    summary: str       # the first sentence of its docstring


def namespaces() -> list[tuple[str, ModuleType]]:
    import deepx_flow as dx
    return [("dx", dx), ("dx.nn", dx.nn), ("dx.random", dx.random)]


def graph_functions() -> list[Function]:
    """The public functions of `dx`, `dx.nn` and `dx.random` that build tensors and are not
    an operator's own builder, by name."""
    from deepx_flow.ops import OPS
    from deepx_flow.sdk import functions as primitives
    operators = {id(getattr(primitives, op)) for op in OPS if hasattr(primitives, op)}
    found = []
    for prefix, module in namespaces():
        for name in sorted(module.__all__):
            fn = getattr(module, name)
            alias = fn.__name__ != name and fn.__name__ in module.__all__  # concatenate
            if not inspect.isfunction(fn) or not _makes_tensors(fn) \
                    or (id(fn) in operators and not alias):
                continue
            summary = f"another name for {prefix}.{fn.__name__}" if alias \
                else _summary(fn.__doc__)
            found.append(Function(f"{prefix}.{name}", _arguments(fn), summary))
    return found


def _makes_tensors(fn) -> bool:
    """Whether `fn` is annotated to return a Tensor (or a tuple of them)."""
    returns = inspect.signature(fn).return_annotation
    return "Tensor" in (returns if isinstance(returns, str) else getattr(returns, "__name__",
                                                                         str(returns)))


def _arguments(fn) -> str:
    """The parameters as a call shows them, without their type hints."""
    params = [p.replace(annotation=inspect.Parameter.empty)
              for p in inspect.signature(fn).parameters.values()]
    return str(inspect.Signature(params))


def _summary(doc: str | None, limit: int = SUMMARY_CHARS) -> str:
    """The first sentence of a docstring, on one line, cut at a word to `limit` characters."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    end = paragraph.find(". ")
    sentence = paragraph[:end + 1] if end >= 0 else paragraph
    if len(sentence) > limit:
        sentence = sentence[:sentence.rfind(" ", 0, limit - 3)] + "..."
    return sentence or "-"


def function_table() -> str:
    """`graph_functions()` as the text table `deepx-flow ops` prints."""
    from deepx_flow.text_table import text_table
    rows = [(f.name, f.arguments, f.summary) for f in graph_functions()]
    return text_table(("function", "arguments", "what it computes"), rows,
                      title="Functions built from the operators above (dx, dx.nn, dx.random):")
