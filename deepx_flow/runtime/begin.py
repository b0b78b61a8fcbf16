"""Starting a run on the scheduler in one round trip: the recorder tracks its keys
(`recorder_plugin.py`) and the supervisor watches them (`supervisor.py`).

Both must hear of the run before its graph arrives, so each was a round trip the driver
waited for; a small run is a handful of round trips in all, so they are made one, with the
run's key names sent once for both. The plugins are installed once per cluster: the call
says when one is missing, and the driver installs it and asks again.
"""

from __future__ import annotations

from deepx_flow.runtime import recorder_plugin, supervisor


def begin(dask_scheduler, names, watch: dict, track: dict | None = None) -> bool:
    """Run on the scheduler: watch the run whose keys are named `names` (`watch`: the rest
    of `supervisor.watch`'s arguments) and, given `track` (the rest of
    `recorder_plugin.track`'s), record it. False, having done nothing, when a plugin it
    needs is not installed."""
    plugins = dask_scheduler.plugins
    if supervisor.PLUGIN_NAME not in plugins or (
            track is not None and recorder_plugin.PLUGIN_NAME not in plugins):
        return False
    if track is not None:
        recorder_plugin.track(dask_scheduler, names=names, **track)
    supervisor.watch(dask_scheduler, names=names, **watch)
    return True


def begin_run(client, names, watch: dict, track: dict | None = None) -> None:
    """Have the scheduler behind `client` watch (and, given `track`, record) a run: one
    round trip once the plugins are there."""
    if client.run_on_scheduler(begin, names=names, watch=watch, track=track):
        return
    if track is not None:
        from deepx_flow.runtime.recording import _install_plugins
        _install_plugins(client)
    client.register_plugin(supervisor.Supervisor())  # idempotent: kept if already there
    client.run_on_scheduler(begin, names=names, watch=watch, track=track)
