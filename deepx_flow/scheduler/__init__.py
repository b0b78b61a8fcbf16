"""Cron schedules on asset selections, run by the `deepx-flow scheduler` daemon: pure tick
decisions (`ticks`, `liveness`), the tick rows (`records`) and the daemon shell (`daemon`).
Schedules themselves are defined with `dx.schedule` (`deepx_flow.assets.schedule`)."""

from deepx_flow.scheduler.daemon import SchedulerDaemon, serve_until_signalled
from deepx_flow.scheduler.ticks import Decision, decide_ticks, next_tick

__all__ = ["Decision", "SchedulerDaemon", "decide_ticks", "next_tick", "serve_until_signalled"]
