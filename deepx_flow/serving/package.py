"""A trained model as a version in a model repository: `dx.serving.package`.

`dx.train`'s checkpoints hold parameters and optimizer state, not the forward graph a
server runs. A package writes both: the forward graph, built by `forward(params, **inputs)`
over the example inputs' shapes, as a graph spec (`model.yaml`), and the parameters bound
to it (`weights.npz`), into the next version folder of a model in the repository, where
`deepx-flow serve` serves it (`model.py`'s SpecModel: the batch axis follows the example's
first axis when the graph holds together with another size there). `package.json` beside
them records the digests of the graph and of the parameters, and the training and
checkpoint they came from.

    fit = dx.train(loss, params, data=(x, y), ...)
    dx.serving.package("classifier", lambda p, x: dx.softmax(model(p, x)), fit,
                       example_inputs={"x": x[:1]}, repository="models")

A version is written to a hidden folder, then renamed into place: a server never sees half
of one. Then it is recorded in the metadata database as a version of the asset
`model.<name>` (storage PACKAGE_STORAGE, at the version folder): its code version the
graph's digest, its manifest digest package.json's (which holds both digests), its
upstream the training checkpoint it binds, so that the asset's versions are the model's,
with their lineage (the version folder's package.json names the asset version). A
package has no array to read: `dx.load` of it says so; a version whose record fails is
removed, not left to be served.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np

from deepx_flow.assets.stored import PACKAGE_STORAGE
from deepx_flow.errors import GraphError, InputError, shown
from deepx_flow.serving.model import PACKAGE_FILE, WEIGHTS_FILE, _sha256


def asset_of(name: str) -> str:
    """The asset whose versions are model `name`'s packages."""
    return f"model.{name}"


def package(name: str, forward, params, example_inputs: dict, repository,
            db=None) -> Path:
    """Write `forward` over `params` as the next version of model `name` in `repository`
    (a folder in Triton's layout); the version folder written.

    Parameters
    ----------
    name : str
        The model's name (its folder).
    forward : callable
        `forward(params, **inputs)`: the parameters as tensors (by name), the inputs as
        tensors of the example inputs' shapes and dtypes; returns a Tensor (the output
        `output`) or a dict of them.
    params : dx.Fit, or dict of str to ndarray
        The trained parameters: a `dx.train` result (its checkpoint is recorded), or arrays.
    example_inputs : dict of str to ndarray
        One example of each request input (its first axis is the batch where the graph
        allows another size there).
    repository : path
        The model repository's folder.
    db : str or Database, optional
        The metadata database the version is recorded in (the default one otherwise).
    """
    from deepx_flow.sdk.build import build_graph
    from deepx_flow.sdk.functions import input as input_
    from deepx_flow.sdk.tensor import Tensor
    from deepx_flow.serving.repository import NAME
    from deepx_flow.train.loop import _input_name as weight_name  # as Fit.params names them
    from deepx_flow.sdk.bindings import bound_inputs, carried_array
    from deepx_flow.spec.writer import graph_to_document

    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InputError(f"model name {shown(name)} is not 1 to 128 letters, digits, '_', '.' "
                         f"or '-'")
    values, origin = _params(params)
    if not isinstance(example_inputs, dict) or not example_inputs:
        raise InputError("example_inputs is a dict of input name -> an example array")
    weights = {weight_name(n): np.asarray(v) for n, v in values.items()}
    clash = sorted(set(weights) & set(example_inputs))
    if clash:
        raise InputError(f"input(s) {', '.join(map(shown, clash))} are also parameters' names")
    p = {n: input_(weight_name(n), v.shape, v.dtype.name) for n, v in values.items()}
    inputs = {}
    for n, example in example_inputs.items():
        example = np.asarray(example)
        inputs[n] = input_(n, example.shape, example.dtype.name)
    try:
        out = forward(p, **inputs)
    except (GraphError, InputError):
        raise
    except Exception as err:
        raise GraphError(f"model {name}: forward raised {type(err).__name__}: {err}") \
            from err
    outputs = {"output": out} if isinstance(out, Tensor) else out
    if not isinstance(outputs, dict) or not outputs or \
            not all(isinstance(t, Tensor) for t in outputs.values()):
        raise GraphError(f"model {name}: forward must return a Tensor or a dict of Tensors, "
                         f"got {type(out).__name__}")
    graph = build_graph(outputs)
    used = {node.id for node in graph.inputs}
    missing = sorted(set(inputs) - used)
    if missing:
        raise GraphError(f"model {name}: forward does not read input(s) "
                         f"{', '.join(map(shown, missing))}")
    spec = json.dumps(_untyped(graph_to_document(graph, name)), indent=1)
    # the parameters, and the arrays the tensors carry (NumPy operands of forward's code)
    carried = {n: np.asarray(carried_array(b)) for n, b in bound_inputs(outputs).items()}
    bound = {n: a for n, a in {**weights, **carried}.items() if n in used}
    return _write(Path(repository) / name, spec, bound, origin, db)


def _untyped(doc: dict) -> dict:
    """The spec without the shapes and dtypes its reader infers (those an operator does not
    declare): built again with another batch size, it still holds together."""
    from deepx_flow.ops import OPS
    for entry in doc.get("nodes", ()):
        declared = OPS[entry["op"]].declared
        for field in ("shape", "dtype"):
            if field not in declared:
                entry.pop(field, None)
    return doc


def _params(params) -> tuple[dict, dict]:
    from deepx_flow.train import Fit
    if isinstance(params, Fit):
        return dict(params.values), {"training": params.training_id,
                                     "checkpoint": params.checkpoint}
    if isinstance(params, dict) and all(isinstance(v, np.ndarray) for v in params.values()):
        return dict(params), {}
    raise InputError(f"params is {shown(params)}, not a dx.train result or a dict of arrays")


def _write(folder: Path, spec: str, weights: dict, origin: dict, db) -> Path:
    from deepx_flow.meta import open_db
    db = open_db(db)  # (opened first: a database that cannot be opened writes nothing)
    upstream = _checkpoint_asset(db, origin.get("checkpoint"))
    asset_version = uuid.uuid4().hex
    folder.mkdir(parents=True, exist_ok=True)
    versions = [int(p.name) for p in folder.iterdir()
                if p.is_dir() and p.name.isdigit() and p.name.isascii()]
    version = str(max(versions, default=0) + 1)
    hidden = folder / f".{version}.{uuid.uuid4().hex[:8]}.partial"
    hidden.mkdir()
    try:
        (hidden / "model.yaml").write_bytes(spec.encode())  # (hashed as written)
        with open(hidden / WEIGHTS_FILE, "wb") as f:
            np.savez(f, **weights)
            f.flush()
            os.fsync(f.fileno())
        manifest = {"graph_sha256": _sha256(hidden / "model.yaml"),
                    "weights_sha256": _sha256(hidden / WEIGHTS_FILE),
                    "created_at": time.time(), **origin,
                    "asset": asset_of(folder.name), "asset_version": asset_version}
        (hidden / PACKAGE_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
        os.rename(hidden, folder / version)  # a version another writer took: refused
    except BaseException:
        shutil.rmtree(hidden, ignore_errors=True)
        raise
    try:
        _record(db, folder / version, manifest, asset_version, upstream)
    except BaseException:  # not recorded: not left to be served either
        shutil.rmtree(folder / version, ignore_errors=True)
        raise
    return folder / version


def _checkpoint_asset(db, checkpoint: str | None) -> dict:
    """{checkpoint's asset: its version} for the packaged training's checkpoint (none for
    parameters given as arrays, or a training that kept no checkpoint)."""
    if not checkpoint:
        return {}
    from sqlmodel import select

    from deepx_flow.meta.models import AssetMaterialization
    with db.read() as session:
        row = session.exec(select(AssetMaterialization).where(
            AssetMaterialization.version == checkpoint)).first()
    if row is None:
        raise InputError(f"the training's checkpoint {checkpoint[:12]}... is not in the "
                         f"metadata database {db.display_url}: package with the database "
                         f"it was recorded in (db=)")
    return {row.asset: checkpoint}


def _record(db, where: Path, manifest: dict, asset_version: str, upstream: dict) -> None:
    """The package as a version of its model's asset (after its files: a version is
    visible once complete)."""
    from deepx_flow.assets import catalog
    from deepx_flow.meta.models import AssetMaterialization
    nbytes = sum(p.stat().st_size for p in where.iterdir())
    catalog.record_all(db, [(AssetMaterialization(
        version=asset_version, asset=manifest["asset"], code_version=manifest["graph_sha256"],
        upstream_versions=json.dumps(upstream), shape="[]", dtype="package", nbytes=nbytes,
        storage=PACKAGE_STORAGE, uri=str(where.resolve()),
        manifest_digest=_sha256(where / PACKAGE_FILE), created_at=time.time()), [])])

