"""Every CUDA kernel the GPU engine generates compiles, proven without a GPU.

The GPU engine's one code generator is `fused_gpu.kernel_source`: every fused elementwise
chain, matmul epilogue and reduction prologue becomes a CuPy `ElementwiseKernel` from it
(random sources, windows, scatters, softmax and scans run CuPy's own kernels). Here the
whole source CuPy would give NVRTC for each (its headers and its wrapper, from the installed
CuPy: `kernels/cuda_source.py`) is compiled by NVRTC for A100 (compute_80) and H100/H200
(compute_90), for:

- every operator on every dtype it takes (the same cases the CPU engines are checked on),
  and every cast, the instructions of the same input dtypes in one kernel;
- programs hypothesis makes: chains over every operator and dtype, constants of every kind
  (NaN, infinities, -0.0, the extreme integers), inputs read more than once, and the
  broadcasting layout (two dimensions, an input not contiguous);
- every program that real graphs give the engine (an MLP, a training step with its
  gradients and Adam, attention, layer norm, a conv net as a batch chain, float16 and integer
  chains, reductions with prologues), recorded from the engine's entry point while the
  graphs run on the CPU engines here.

A kernel that does not compile fails with its NVRTC log and its source. Without CuPy and NVRTC
(the `nvrtc` extra, which the dev extra includes) these tests skip, unless
DEEPX_REQUIRE_NVRTC=1 (set by `.ci/run`) makes that a failure.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.errors import CodegenError
from deepx_flow.kernels import cuda_source, fused
from deepx_flow.kernels.elementwise import COMPARISONS, OPS
from deepx_flow.ops.elementwise import BINARY
from tests.kernels.cases import ALL_CASES, CHAIN10, DTYPES, result_dtype


def _nvrtc_or_skip() -> None:
    reason = cuda_source.cuda_compiler_missing()
    if reason:
        if os.environ.get("DEEPX_REQUIRE_NVRTC") == "1":
            pytest.fail(f"DEEPX_REQUIRE_NVRTC=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def nvrtc():
    _nvrtc_or_skip()


def compiles(program, in_dtypes, archs=cuda_source.ARCHS, **layout) -> None:
    """Compile the program's whole kernel for each architecture; fail with NVRTC's log."""
    compile_all([(program, in_dtypes)], archs, **layout)


def compile_all(cases, archs=cuda_source.ARCHS, **layout) -> None:
    """Compile every (program, in_dtypes) for each architecture; fail once, naming every
    kernel that failed, with NVRTC's log."""
    failed = []
    for program, in_dtypes in cases:
        source = cuda_source.program_source(program, in_dtypes, **layout)
        for arch in archs:
            try:
                ptx = cuda_source.compile_ptx(source, arch)
            except CodegenError as err:
                failed.append(f"{program!r} on {in_dtypes}:\n{err}")
                continue
            assert f".target sm_{arch.split('_')[1]}" in ptx
    if failed:
        pytest.fail(f"{len(failed)} kernel(s) did not compile; the first:\n"
                    + "\n\n".join(failed[:3]))


# --- the compiler is checked to refuse what is wrong -------------------------------------

def test_a_kernel_nvrtc_refuses_is_an_error_with_its_log_and_source():
    source = cuda_source.program_source(CHAIN10, ("float32", "float32"))
    broken = source.replace("tanh(t1)", "tanh(t1, nonsense)")
    with pytest.raises(CodegenError) as caught:
        cuda_source.compile_ptx(broken, "compute_90", "broken")
    text = str(caught.value)
    line = broken.splitlines().index(
        next(x for x in broken.splitlines() if "nonsense" in x)) + 1
    assert f"broken.cu({line}): error" in text  # NVRTC's log, pointing at the line
    assert f"{line:5d}> const float t2 = tanh(t1, nonsense);" in text  # and the line itself


def test_the_source_is_cupys_wrapper_around_our_body():
    source = cuda_source.program_source(CHAIN10, ("float32", "float32"))
    assert source.startswith("#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>")
    assert ("extern \"C\" __global__ void dx_fused_" in source
            and "const CArray<float, 1, 1, 1> _raw_in0" in source)
    assert "dx_ipow" in source and "out0 = t9;" in source
    broadcast = cuda_source.program_source(CHAIN10, ("float32", "float32"), ndim=2,
                                           contiguous=(True, False))
    assert "CArray<float, 2, 0, 1> _raw_in1" in broadcast
    options = cuda_source.options("compute_80")
    assert "-arch=compute_80" in options and "-ftz=true" in options


# --- every operator, every dtype -----------------------------------------------------------

def by_input_dtypes(instructions) -> list:
    """(program, in_dtypes) kernels, one per input dtypes: every instruction of those
    dtypes in one program (NVRTC checks each statement; a failure's log names its line)."""
    groups: dict = {}
    for op, ins, r in instructions:
        groups.setdefault(ins, []).append((op, tuple(("in", k) for k in range(len(ins))), r))
    return [(tuple(program), ins) for ins, program in groups.items()]


def test_every_operator_on_every_dtype_compiles():
    kernels = by_input_dtypes(ALL_CASES)
    compile_all(kernels)
    assert sum(len(p) for p, _ in kernels) == len(ALL_CASES) > 300  # every case, once
    assert {op for op, _, _ in ALL_CASES} >= set(OPS) - {"cast", "softmax", "log_softmax"}


def test_every_cast_compiles():
    compile_all(by_input_dtypes([("cast", (a,), b) for a in DTYPES for b in DTYPES
                                 if a != b]))


# --- programs hypothesis makes ------------------------------------------------------------

CONSTANTS = {
    "bool": st.booleans(),
    **{d: st.integers(int(np.iinfo(d).min), int(np.iinfo(d).max))
       for d in ("int8", "uint8", "int16", "int32", "int64", "uint32")},
    **{d: st.sampled_from([0.0, -0.0, 1.0, -2.5, math.inf, -math.inf, math.nan, 1e-30,
                           65504.0, 3.4e38]) | st.floats(-1e6, 1e6)
       for d in ("float16", "float32", "float64")},
}
ELEMENTWISE = sorted(set(OPS) - {"softmax", "log_softmax"})


@st.composite
def programs(draw):
    """A chain of instructions over 1 to 3 inputs of any dtypes, each instruction typed as
    the IR types it (NumPy's rules), reading inputs, earlier results or constants."""
    in_dtypes = tuple(draw(st.lists(st.sampled_from(DTYPES), min_size=1, max_size=3)))
    values = [(("in", k), d) for k, d in enumerate(in_dtypes)]
    program = []
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(ELEMENTWISE))
        if op == "cast":
            arg, dtype = draw(st.sampled_from(values))
            program.append(("cast", (arg,), draw(st.sampled_from(DTYPES))))
        else:
            arity = 3 if op == "where" else 2 if op in COMPARISONS or op in BINARY else 1
            args = []
            for _ in range(arity):
                if draw(st.integers(0, 3)) == 0:  # a constant of some dtype
                    d = draw(st.sampled_from(DTYPES))
                    args.append((("c", draw(CONSTANTS[d]), d), d))
                else:
                    args.append(draw(st.sampled_from(values)))
            dtype = result_dtype(op, tuple(d for _, d in args))
            if dtype is None:  # the operator does not take these dtypes
                continue
            program.append((op, tuple(a for a, _ in args), dtype))
        values.append((("t", len(program) - 1), program[-1][2]))
    if not program or not any(a[0] == "in" for _, args, _ in program for a in args):
        program.append(("add", (("in", 0), ("in", 0)), result_dtype("add", in_dtypes[:1] * 2)
                        or "int64"))
    return tuple(program), in_dtypes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=programs())
def test_generated_programs_compile(case):
    program, in_dtypes = case
    compiles(program, in_dtypes)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=programs(), data=st.data())
def test_generated_programs_compile_for_broadcast_inputs(case, data):
    program, in_dtypes = case
    contiguous = tuple(data.draw(st.lists(st.booleans(), min_size=len(in_dtypes),
                                          max_size=len(in_dtypes))))
    compiles(program, in_dtypes, archs=("compute_90",), ndim=2, contiguous=contiguous)


# --- the programs real graphs give the engine ----------------------------------------------

def workloads():
    """Small graphs of every kind that makes programs: (outputs, inputs)."""
    rng = np.random.default_rng(0)
    x = dx.input("x", shape=(512, 64), dtype="float32")
    xs = rng.standard_normal((512, 64), dtype=np.float32)
    w = dx.random.normal((64, 32), seed=0, dtype="float32")
    yield dx.relu(x @ w + 1.0).sum(axis=1), {"x": xs}  # the README's MLP: epilogue, sum

    # A training step: gradients (comparisons, where, reciprocals) and Adam's update.
    model = dx.nn.Sequential(dx.nn.Linear(64, 32), dx.nn.gelu, dx.nn.Linear(32, 10))
    params = model.init(seed=0)
    labels = dx.input("labels", shape=(512,), dtype="int64")
    loss = dx.nn.cross_entropy(model(params, x), labels)
    grads = dx.grad(loss, list(params.values()))
    adam = dx.optim.Adam(lr=1e-3)
    scalars = {k: dx.input(f"scalar_{k}", shape=(), dtype="float64")
               for k in adam.scalars(1)}  # as dx.train makes them (train/step.py)
    step = adam.update(params, dict(zip(params, grads)), adam.init(params), scalars)
    yield [loss, step.grad_norm, *step.params.values(),
           *(t for slot in step.state.values() for t in slot.values())], {
        "x": xs, "labels": rng.integers(0, 10, 512),
        **{f"scalar_{k}": np.float64(v) for k, v in adam.scalars(1).items()}}

    # Attention, small: batched matmuls, a softmax, a GELU.
    q = dx.input("q", shape=(2, 64, 16), dtype="float32")
    scores = (q @ dx.transpose(q, (0, 2, 1))) / 4.0
    yield dx.gelu(dx.softmax(scores, axis=-1) @ q), {"q": rng.standard_normal(
        (2, 64, 16), dtype=np.float32)}

    # Column statistics and reductions with prologues; layer norm.
    yield [x.mean(axis=0), x.max(axis=0), ((x - 1.0) ** 2.0).sum(axis=0),
           dx.abs(x).max(), dx.nn.layer_norm(x, axis=-1)], {"x": xs}

    # float16 and integer chains, casts, comparisons feeding where.
    h = dx.input("h", shape=(256, 32), dtype="float16")
    i = dx.input("i", shape=(256, 32), dtype="int32")
    mixed = dx.where(i > 3, dx.exp(h) * 2.0, (h + 1.0).astype("float32"))
    yield [mixed, i * 3 + 1, dx.where(i < 0, i, -i),
           dx.sigmoid(h).sum(axis=1), dx.maximum(i, 7).astype("float64") / 3.0], {
        "h": rng.standard_normal((256, 32)).astype(np.float16),
        "i": rng.integers(-10, 10, (256, 32), dtype=np.int32)}

    # A conv net's forward pass (a batch chain: conv, relu, pool, flatten, matmul).
    img = dx.input("img", shape=(8, 3, 16, 16), dtype="float32")
    kernel = dx.random.normal((4, 3, 3, 3), seed=1, dtype="float32")
    feat = dx.nn.max_pool(dx.relu(dx.nn.conv(img, kernel, padding=1) + 0.1), (2, 2))
    flat = feat.reshape((8, 4 * 8 * 8))
    yield dx.softmax(flat @ dx.random.normal((256, 10), seed=2, dtype="float32"),
                     axis=-1), {"img": rng.standard_normal((8, 3, 16, 16), dtype=np.float32)}


@pytest.mark.timeout(300)
def test_every_program_of_real_graphs_compiles(client, monkeypatch):
    seen: dict = {}
    engine = fused.evaluate

    def recording(program, arrays, out_shape, *args, **kwargs):
        in_dtypes = tuple(np.asarray(a).dtype.name for a in arrays)
        seen.setdefault(repr((program, in_dtypes)), (program, in_dtypes))
        return engine(program, arrays, out_shape, *args, **kwargs)

    # The workers are threads of this process: they call the engine through this name.
    monkeypatch.setattr(fused, "evaluate", recording)
    for outputs, inputs in workloads():
        dx.run(outputs, inputs=inputs, client=client, progress=False)
    from deepx_flow.ir.program import whole_axes
    kernels = [(p, d) for p, d in seen.values()
               if not whole_axes(p) and any(a[0] == "in" for _, args, _ in p for a in args)]
    assert len(kernels) >= 20, len(kernels)  # the graphs really gave the engine programs
    ops = {op for p, _ in kernels for op, _, _ in p}
    assert {"add", "mul", "where", "exp", "gelu"} <= ops, ops
    assert any(d == "float16" for _, ds in kernels for d in ds)
    compile_all(kernels)



def test_fused_gpu_is_the_only_kernel_generator():
    """The tests above cover `fused_gpu`; a new generator in kernels/ must be added here."""
    import re
    from pathlib import Path
    import deepx_flow.kernels as kernels
    makers = re.compile(r"cupy\.(ElementwiseKernel|ReductionKernel|RawKernel|RawModule)\(|"
                        r"cupyx\.jit|cupy\.fuse\(")
    found = sorted(p.name for p in Path(kernels.__file__).parent.glob("*.py")
                   if makers.search(p.read_text()))
    assert found == ["cuda_source.py", "fused_gpu.py"], found  # cuda_source: this test's wrapper
