"""The serving process keeps freed memory in its heap: batches of buffers of a few MB,
allocated and freed again and again, fault no page in after the first."""

import os
import subprocess
import sys

import pytest

CYCLES = """
import resource, sys
import numpy as np
from deepx_flow.serving.heap import retain_freed_memory
if sys.argv[1] == "kept":
    assert retain_freed_memory()

def batch():  # buffers of a batch's kernels, of a few sizes, each written
    for mb in (1, 3, 8, 2, 6, 12, 4, 16, 1):
        a = np.empty(mb << 20, np.uint8)
        a[::4096] = 1
        del a

batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # glibc's
    done = subprocess.run([sys.executable, "-c", CYCLES, mode], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_buffers_stay_in_the_heap_and_fault_nothing_in_again():
    kept, default = _faults("kept"), _faults("default")
    # 10 batches of 53 MB written a page in 4096: 13,500 pages were they all faulted
    assert kept < 100 <= default, (kept, default)
