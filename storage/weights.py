"""Large weights as files: a model's weight of STORED_CONSTANT_BYTES or more is written once
to a `.npy` file under the asset root and bound as that file, so that each task reads the
region it needs where it runs (an imported ONNX model's initializers, `onnx/values.py`; a
packaged model's weights, `serving/model.py`).
"""

from __future__ import annotations

import hashlib

import numpy as np

# Constants at least this large (a model's weights) are bound as `.npy` files, which each
# task reads its region of where it runs: bound as arrays, every chunk of every weight would
# travel inside the graph and be sent to the workers at once, and a model whose weights
# outgrow a worker's memory could not run.
STORED_CONSTANT_BYTES = 16 * 2**20
FOLDER = "weights"  # under the asset root


def stored_weight(array: np.ndarray, digest: str) -> str | None:
    """The `.npy` file holding `array` under the asset root's `weights/` (written once,
    named by its content, renamed into place whole so no reader sees part of it); None
    where the asset root is not a local folder (the array is then bound as it is)."""
    import os
    import tempfile
    from pathlib import Path

    from deepx_flow.assets.root import asset_root
    root = asset_root()
    if "://" in root:
        return None
    folder = Path(root).resolve() / FOLDER  # absolute: workers run elsewhere
    path = folder / f"{digest}.npy"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=folder, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, np.ascontiguousarray(array))
            # readable as any file written here is (mkstemp's are the owner's alone), for
            # workers running as another user on shared storage
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            if not path.exists():  # another process may have put the same file in place
                raise
    return str(path)

def content_digest(array: np.ndarray) -> str:
    """The SHA-1 of an array's dtype, shape and bytes: the name of its file (hashed in
    place: a contiguous array is not copied)."""
    digest = hashlib.sha1(array.dtype.str.encode() + str(array.shape).encode())
    # (as bytes: a buffer of an ml_dtypes type such as bfloat16 cannot be taken)
    digest.update(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)))
    return digest.hexdigest()
