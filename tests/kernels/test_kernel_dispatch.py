"""Device dispatch: NumPy unless an argument is a CuPy array, and no CuPy import to find out."""

import subprocess
import sys
import types

import numpy as np
import pytest

from deepx_flow.errors import ExecutionError
from deepx_flow.kernels import dispatch


def test_numpy_arguments_give_numpy():
    assert dispatch.array_module(np.zeros(3), 1.0, None) is np
    assert dispatch.array_module() is np


def test_importing_and_cpu_dispatch_never_import_cupy():
    code = ("import sys, numpy as np\n"
            "from deepx_flow.kernels import dispatch, fused, random\n"
            "from deepx_flow.kernels import fused_gpu\n"
            "p = (('exp', (('in', 0),), 'float64'),)\n"
            "fused.evaluate(p, [np.zeros(3)], (3,))\n"
            "assert dispatch.array_module(np.zeros(2)) is np\n"
            "fused_gpu.kernel_source(p, ('float64',))\n"
            "print('cupy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_a_loaded_cupy_array_selects_cupy(monkeypatch):
    fake = types.ModuleType("cupy")

    class ndarray:  # stands in for cupy.ndarray
        def get(self):
            return np.arange(3)

    fake.ndarray = ndarray
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert dispatch.array_module(np.zeros(2), ndarray()) is fake
    assert dispatch.array_module(np.zeros(2)) is np
    assert dispatch.is_cupy_array(ndarray())
    np.testing.assert_array_equal(dispatch.to_host(ndarray()), [0, 1, 2])


def test_device_engine_without_a_gpu_is_numpy():
    try:
        import cupy
        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        has_gpu = False
    assert dispatch.device_engine() == ("cupy" if has_gpu else "numpy")
    assert dispatch.device_engine() is dispatch.device_engine()  # cached


def test_to_host_and_asarray_on_engine():
    x = [1.0, 2.0]
    h = dispatch.to_host(x)
    assert isinstance(h, np.ndarray)
    np.testing.assert_array_equal(dispatch.asarray_on_engine(h, "numpy"), x)
    with pytest.raises(ExecutionError, match="unknown array engine 'tpu'"):
        dispatch.asarray_on_engine(h, "tpu")


def test_reshape_chunk_does_not_keep_its_operand_block_alive():
    from deepx_flow.kernels.tasks import reshape_chunk
    block = np.arange(12.0).reshape(3, 4)
    out = reshape_chunk((5,), 3, ((),), block)  # one operand, passed whole
    np.testing.assert_array_equal(out, np.arange(3.0, 8.0))
    assert not np.shares_memory(out, block)
