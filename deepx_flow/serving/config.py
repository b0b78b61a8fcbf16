"""A model's `config.pbtxt` (Triton's, in protobuf text format), read and checked.

    max_batch_size: 64
    input [ { name: "x", data_type: TYPE_FP32, dims: [ 784 ] } ]
    output [ { name: "probs", data_type: TYPE_FP32, dims: [ 10 ] } ]
    dynamic_batching { preferred_batch_size: [ 16, 32 ], max_queue_delay_microseconds: 500 }
    instance_group [ { count: 2, kind: KIND_CPU } ]   (KIND_CPU: in the gateway's process)

Every field is optional: without a config, a model whose inputs all have a varying first
axis is served with `max_batch_size` 0 (each request alone) and one replica, as Triton
does for a model without one. A config that sets a field deepx_flow does not honour
(`proto/inference/model_config.proto` lists those it does) is refused, naming the field,
rather than served without what it asks for; so is one whose inputs or outputs do not match
the model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deepx_flow.errors import InputError

CONFIG_FILE = "config.pbtxt"
DEFAULT_DELAY_US = 100  # Triton's default wait when dynamic batching is on without a delay


@dataclass(frozen=True)
class ServingConfig:
    max_batch_size: int = 0  # 0: each request alone, its shape the model's
    dynamic_batching: bool = False
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    replicas: int = 1
    inputs: tuple = ()  # (name, datatype, dims) the config declares, to check
    outputs: tuple = ()
    model_file: str | None = None  # None: model.onnx, else model.yaml (or .yml, .json)
    in_gateway: bool = False  # KIND_CPU: replicas in the gateway's process, no hop to a worker


def read_config(folder: Path, name: str) -> ServingConfig:
    """The config of the model in `folder` (named `name`): its config.pbtxt, or the
    defaults when there is none."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        return ServingConfig()
    from google.protobuf import text_format

    from deepx_flow.contract.inference import model_config_pb2 as mc
    try:
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
    except text_format.ParseError as err:
        raise InputError(f"{path}: {err} (deepx_flow serves the fields of "
                         f"proto/inference/model_config.proto)") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not text: {err}") from None
    if config.name and config.name != name:
        raise InputError(f"{path}: name {config.name!r} is not the model's folder name "
                         f"{name!r}")
    if config.max_batch_size < 0:
        raise InputError(f"{path}: max_batch_size {config.max_batch_size} is negative")
    batching = config.HasField("dynamic_batching")
    if batching and config.max_batch_size == 0:
        raise InputError(f"{path}: dynamic_batching needs max_batch_size above 0")
    preferred = tuple(config.dynamic_batching.preferred_batch_size)
    bad = [p for p in preferred if not 0 < p <= config.max_batch_size]
    if bad:
        raise InputError(f"{path}: preferred_batch_size {bad[0]} is not from 1 to "
                         f"max_batch_size {config.max_batch_size}")
    replicas = sum(g.count or 1 for g in config.instance_group) or 1
    kinds = {mc.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group}
    if "KIND_GPU" in kinds:
        raise InputError(f"{path}: instance_group kind KIND_GPU: this server places "
                         f"replicas on the cluster's workers itself (GPU workers where "
                         f"there are GPUs); leave kind out or use KIND_AUTO or KIND_CPU")
    if len(kinds - {"KIND_MODEL"}) > 1:
        raise InputError(f"{path}: instance_group kinds {', '.join(sorted(kinds))}: give a "
                         f"model's replicas one kind")
    return ServingConfig(
        config.max_batch_size, batching, preferred,
        config.dynamic_batching.max_queue_delay_microseconds or
        (DEFAULT_DELAY_US if batching else 0), replicas,
        tuple((t.name, _datatype(t.data_type, path), tuple(t.dims)) for t in config.input),
        tuple((t.name, _datatype(t.data_type, path), tuple(t.dims)) for t in config.output),
        config.default_model_filename or None, "KIND_CPU" in kinds)


def checked_against(config: ServingConfig, model, path: Path) -> None:
    """The config's inputs and outputs are the model's (with max_batch_size, its dims are
    one row's: the model's shape without its leading batch axis, which must vary)."""
    for what, declared, actual in (("input", config.inputs, model.inputs),
                                   ("output", config.outputs, model.outputs)):
        specs = {s.name: s for s in actual}
        for name, datatype, dims in declared:
            spec = specs.get(name)
            if spec is None:
                raise InputError(f"{path}: {what} {name!r} is not one of the model's "
                                 f"({', '.join(specs)})")
            shape = spec.shape
            if config.max_batch_size:
                if not shape or shape[0] != -1:
                    raise InputError(f"{path}: max_batch_size is set but the model's {what} "
                                     f"{name!r} has no varying first axis (shape "
                                     f"{list(shape)})")
                shape = shape[1:]
            if datatype != spec.datatype or len(dims) != len(shape) or any(
                    d != -1 and s != -1 and d != s for d, s in zip(dims, shape)):
                raise InputError(f"{path}: {what} {name!r} is declared {datatype}"
                                 f"{list(dims)}, but the model's is {spec.datatype}"
                                 f"{list(shape)}")
    if config.max_batch_size:
        fixed = [s.name for s in (*model.inputs, *model.outputs)
                 if not s.shape or s.shape[0] != -1]
        if fixed:
            raise InputError(f"{path}: max_batch_size is set but the model's "
                             f"{', '.join(fixed)} have no varying first axis to batch along")


def _datatype(value: int, path: Path) -> str:
    from deepx_flow.contract.inference import model_config_pb2 as mc
    name = mc.DataType.Name(value).removeprefix("TYPE_")
    if name in ("INVALID", "STRING"):
        raise InputError(f"{path}: data_type TYPE_{name} is not served (tensors of numbers "
                         f"and booleans)")
    return name
