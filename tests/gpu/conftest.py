"""GPU tests run only where CuPy imports and a CUDA device is visible; elsewhere they skip.

Test modules here also start with `pytest.importorskip("cupy")`, so they skip at import even
when run on their own; this hook covers the case of CuPy installed without a usable device.
"""

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _gpu_missing() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    try:
        import cupy
    except Exception as e:  # not installed, or a broken CUDA install
        return f"needs CuPy ({type(e).__name__}: {e})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "needs a CUDA device"
    except Exception as e:  # no driver, or CUDA_VISIBLE_DEVICES hides every device
        return f"needs a CUDA device ({type(e).__name__})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_missing()
    for item in items:
        # conftest hooks see the whole session's items: touch only this folder's tests
        if Path(item.path).is_relative_to(HERE):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
