"""No module of deepx_flow imports, directly or through others, a module that imports it back:
the layering is one way (issue 35). Every import counts, those inside functions too (a lazy
import is still a dependency), but a module's import of its own package (which Python runs
first anyway) does not.

One circle is kept, inside the SDK: a Tensor's methods are the SDK's functions (`x.sum()` is
`dx.sum(x)`, `x.compute()` is `dx.run(x)`, `x[1:]` is indexing), and those functions make
Tensors, as NumPy's ndarray methods call numpy's functions. It is one class written in files
by topic; nothing outside the SDK is part of it (the runtime takes graphs, not tensors)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "deepx_flow"
KNOWN = {frozenset({
    "sdk.bindings", "sdk.build", "sdk.display", "sdk.functions", "sdk.indexing",
    "sdk.numpy_dispatch", "sdk.run", "sdk.tensor"})}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports() -> dict[str, set[str]]:
    """Module -> the modules of deepx_flow it imports (its own packages left out)."""
    found = modules()

    def resolved(name: str) -> str:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name

    edges = {m: set() for m in found}
    for module, path in found.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                # (`from package import submodule` imports the submodule)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base
                         for a in node.names]
            else:
                continue
            for name in names:
                target = resolved(name) if name.startswith("deepx_flow") else ""
                if target and target != module and not module.startswith(target + "."):
                    edges[module].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def test_no_module_imports_one_that_imports_it_back():
    found = [{m.removeprefix("deepx_flow.") for m in c} for c in circles(imports())]
    new = [sorted(c) for c in found if not any(c <= known for known in KNOWN)]
    assert new == [], f"import circles: {new}"


def test_the_check_finds_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(edges) == [{"a", "b", "c"}]
    found = imports()
    assert "deepx_flow.ops.registry" in found["deepx_flow.ops.elementwise"]
    assert "deepx_flow.ops" not in found["deepx_flow.ops.elementwise"]  # (its own package)


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in edges.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_the_runtime_and_the_compiler_reach_nothing_of_the_sdk():
    """Below the SDK: they take a Graph and its inputs (issue 35), and write graphs with the
    spec's writer, not with its reader (which expands composites with the SDK's functions)."""
    edges = imports()
    below = [m for m in edges if m.startswith(("deepx_flow.runtime.", "deepx_flow.compiler."))]
    assert len(below) > 30
    assert "deepx_flow.runtime.run" in reachable(edges, "deepx_flow.sdk.tensor")  # (it finds)
    for module in below:
        above = sorted(m for m in reachable(edges, module) if m.startswith("deepx_flow.sdk"))
        assert above == [], f"{module} reaches {above}"
