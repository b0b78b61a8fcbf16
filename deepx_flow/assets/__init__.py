"""Dagster-like assets on tensors: definitions, selections, materialization into versioned
storage, staleness, and loading stored versions back as lazy tensors."""

from deepx_flow.assets.definition import AssetDef, Definitions, asset
from deepx_flow.assets.materialize import Materialized, load, materialize
from deepx_flow.assets.selection import select
from deepx_flow.assets.status import StatusTable, status

__all__ = ["AssetDef", "Definitions", "Materialized", "StatusTable", "asset", "load",
           "materialize", "select", "status"]
