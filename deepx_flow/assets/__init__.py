"""Dagster-like assets on tensors: definitions, selections, partitions, checks,
materialization into versioned storage, staleness, and loading stored versions back as
lazy tensors."""

from deepx_flow.assets.definition import AssetDef, Definitions, asset
from deepx_flow.assets.materialize import Materialized, materialize
from deepx_flow.assets.partitions import (DailyPartitions, HourlyPartitions, MonthlyPartitions,
                                          Partition, StaticPartitions, TimeWindowPartitions,
                                          WeeklyPartitions)
from deepx_flow.assets.schedule import ScheduleDef, schedule
from deepx_flow.assets.selection import select
from deepx_flow.assets.status import StatusTable, status
from deepx_flow.assets.stored import load

__all__ = ["AssetDef", "Definitions", "Materialized", "StatusTable", "asset", "load",
           "materialize", "select", "status", "DailyPartitions", "HourlyPartitions",
           "MonthlyPartitions", "Partition", "StaticPartitions", "TimeWindowPartitions",
           "WeeklyPartitions", "ScheduleDef", "schedule"]
