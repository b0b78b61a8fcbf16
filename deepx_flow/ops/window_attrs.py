"""A window operator's (conv, max_pool, avg_pool) strides, pads and dilations, checked: what
the operators (`ops/window.py`), their gradients (`ops/window_grad.py`) and the lowering read
alike."""

from __future__ import annotations

from deepx_flow.errors import GraphError, shown


def spatial_attrs(node, spatial: int, kernel=None) -> tuple:
    """(strides, pads, dilations) of a window node, checked against `spatial` axes."""
    def get(name, default, length):
        value = node.attr(name)
        if value is not None and not isinstance(value, (tuple, list)):
            raise GraphError(f"{node.op}: {name} must be {length} integers, got "
                             f"{shown(value)}", node.id)
        value = tuple([default] * length) if value is None else tuple(value)
        if len(value) != length or not all(isinstance(v, int) and not isinstance(v, bool)
                                           for v in value):
            raise GraphError(f"{node.op}: {name} must be {length} integers, got "
                             f"{shown(node.attr(name))}", node.id)
        return value
    strides = get("strides", 1, spatial)
    dilations = get("dilations", 1, spatial)
    pads = get("pads", 0, 2 * spatial)
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations) or any(p < 0 for p in pads):
        raise GraphError(f"{node.op}: strides and dilations must be positive and pads "
                         f"non-negative, got strides {strides}, dilations {dilations}, "
                         f"pads {pads}", node.id)
    return strides, pads, dilations
