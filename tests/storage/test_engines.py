"""Storage engines behind one protocol: the built-in Zarr and memory engines, and engines of
third-party packages found through real entry points.

Each third-party test writes a tiny installed distribution (a `*.dist-info` folder with
METADATA and entry_points.txt, and its module) into tmp_path and puts tmp_path on sys.path,
where importlib.metadata finds it as it would any installed package.
"""

import sys
import warnings

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.errors import InputError
from deepx_flow.storage.engines import StorageEngine, as_input, engines, get_engine
from tests.helpers import cluster_with_memory

SPEC = cluster_with_memory(40_000)
SHAPE = (70, 21)

MODULE = """\
import os

import numpy as np


class NpyEngine:
    \"\"\"Gathers the tensor and saves one .npy file (fine for small tensors).\"\"\"

    name = "{name}"

    def write(self, persisted, uri):
        if os.path.exists(uri):
            raise FileExistsError(uri)
        array = persisted.to_numpy()
        np.save(uri, array)
        return {{"uri": uri, "shape": array.shape, "dtype": array.dtype.name,
                 "chunks": array.shape, "nbytes": array.nbytes,
                 "stored_bytes": os.path.getsize(uri), "seconds": 0.0}}

    def reader_uri(self, uri):
        return uri

    def delete(self, uri):
        if os.path.exists(uri):
            os.remove(uri)


ENGINE = NpyEngine()


class NoMethods:
    name = "incomplete"


class ZarrAgain(NpyEngine):
    name = "zarr"
"""


@pytest.fixture(autouse=True)
def forget_test_engines():
    """Each test sees only its own test distributions: their modules are forgotten, and the
    engines are looked up again once tmp_path has left sys.path."""
    yield
    for name in [m for m in sys.modules if m.startswith("deepx_demo_")]:
        del sys.modules[name]
    engines(refresh=True)


def install(tmp_path, monkeypatch, dist: str, entry_points: dict[str, str], name: str):
    """Write distribution `dist` (module `dist` with underscores) declaring `entry_points`
    in the deepx_flow.storage group."""
    module = dist.replace("-", "_")
    (tmp_path / f"{module}.py").write_text(MODULE.format(name=name))
    info = tmp_path / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[deepx_flow.storage]\n{lines}")
    monkeypatch.syspath_prepend(str(tmp_path))


def persisted(client, x_np):
    return dx.persist(dx.input("x", SHAPE, "float64") - 0.5, inputs={"x": x_np},
                      client=client, cluster=SPEC)


def read_back(client, value):
    return dx.run(dx.input("x", SHAPE, "float64") * 1, inputs={"x": value}, client=client)


@pytest.fixture
def x_np():
    return np.random.default_rng(3).standard_normal(SHAPE)


def test_builtin_engines_follow_the_protocol():
    found = engines()
    assert {"zarr", "memory"} <= set(found)
    assert all(isinstance(e, StorageEngine) for e in found.values())
    with pytest.raises(InputError, match="unknown storage engine 'lance'.*memory, zarr"):
        get_engine("lance")


def test_zarr_engine_round_trip(client, x_np, tmp_path):
    engine = get_engine("zarr")
    uri = str(tmp_path / "v1.zarr")
    info = engine.write(persisted(client, x_np), uri)
    assert info["uri"] == uri and engine.is_complete(uri)
    np.testing.assert_array_equal(read_back(client, engine.reader_uri(uri)), x_np - 0.5)
    np.testing.assert_array_equal(read_back(client, as_input("zarr", uri)), x_np - 0.5)
    engine.delete(uri)
    assert not (tmp_path / "v1.zarr").exists()
    engine.delete(uri)  # a second delete is fine


def test_memory_engine_round_trip(client, x_np):
    engine = get_engine("memory")
    p = persisted(client, x_np)
    uri = "memory://features/v1"
    info = engine.write(p, uri)
    assert info["uri"] == uri and info["shape"] == SHAPE and info["dtype"] == "float64"
    assert info["nbytes"] == x_np.nbytes
    assert uri in engine.uris()
    p.release()  # the engine holds its own references: the stored chunks stay
    stored = engine.get(uri)
    assert stored.shape == SHAPE and stored.futures
    np.testing.assert_array_equal(read_back(client, as_input(engine, uri)), x_np - 0.5)

    with pytest.raises(InputError, match="already exists"):
        engine.write(persisted(client, x_np), uri)
    with pytest.raises(InputError, match="not in a file"):
        engine.reader_uri(uri)
    with pytest.raises(InputError, match="memory://"):
        engine.write(stored, "features/v2")

    engine.delete(uri)
    assert uri not in engine.uris()
    with pytest.raises(InputError, match="nothing is stored at memory://features/v1"):
        engine.get(uri)


def test_a_third_party_engine_is_found_through_its_entry_point(client, x_np, tmp_path,
                                                               monkeypatch):
    install(tmp_path, monkeypatch, "deepx-demo-npy",
            {"npy": "deepx_demo_npy:NpyEngine"}, "demo-npy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good entry point warns about nothing
        engine = get_engine("demo-npy")  # not seen before: found by looking again
    assert type(engine).__name__ == "NpyEngine" and isinstance(engine, StorageEngine)

    uri = str(tmp_path / "v1.npy")
    engine.write(persisted(client, x_np), uri)
    np.testing.assert_array_equal(read_back(client, as_input("demo-npy", uri)), x_np - 0.5)


@pytest.mark.parametrize("value, problem", [
    ("deepx_demo_gone:ENGINE", "failed to load: ModuleNotFoundError"),
    ("deepx_demo_bad:no_such_name", "failed to load: AttributeError"),
    ("deepx_demo_bad:NoMethods", "lacks write, reader_uri, delete"),
    ("deepx_demo_bad:ZarrAgain", "storage engine 'zarr' is already registered"),
])
def test_a_broken_entry_point_warns_once_and_adds_nothing(tmp_path, monkeypatch, value,
                                                         problem):
    install(tmp_path, monkeypatch, "deepx-demo-bad",
            {"broken": value, "fine": "deepx_demo_bad:ENGINE"}, "fine-npy")
    with pytest.warns(RuntimeWarning) as caught:
        found = engines(refresh=True)
    messages = [str(w.message) for w in caught if "deepx_flow.storage" in str(w.message)]
    assert len(messages) == 1, messages
    assert f"'broken = {value}'" in messages[0] and "deepx-demo-bad" in messages[0]
    assert problem in messages[0]
    # The other entry point of the same distribution and the built-ins are unaffected.
    assert "fine-npy" in found and type(found["zarr"]).__name__ == "ZarrEngine"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # looking again does not warn again
        engines(refresh=True)
