"""`deepx-flow registry show` and `registry probe`, through `registry_cmd.run` with the
arguments parsed as main.py parses them (--db from a parent parser)."""

import argparse

import pytest
from distributed import Client
from sqlmodel import select

from deepx_flow.cli import registry_cmd
from deepx_flow.errors import ClusterError
from deepx_flow.meta import open_db
from deepx_flow.meta.models import Link, Worker
from deepx_flow.ops import OPS


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{(tmp_path / 'd.db').as_posix()}"


def registry(*argv) -> int:
    """Parse as main.py does: --db comes from a parent parser given to each subcommand."""
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", metavar="URL")
    parser = argparse.ArgumentParser(prog="deepx-flow")
    sub = parser.add_subparsers(dest="command", required=True)
    registry_cmd.add_parser(sub, [db])
    return registry_cmd.run(parser.parse_args(argv))


def test_show_an_empty_registry(url, capsys):
    assert registry("registry", "show", "--db", url) == 0
    out = capsys.readouterr().out
    assert "No cluster registered yet" in out
    assert f"Operators: {len(OPS)} registered ({len(OPS)} built-in, 0 from entry points" in out


def test_show_registers_then_probe_measures(url, scheduler, capsys):
    assert registry("registry", "show", "--db", url, "--scheduler", scheduler) == 0
    out = capsys.readouterr().out
    with open_db(url).session() as session:
        workers = session.exec(select(Worker)).all()
    assert len(workers) == 2
    for w in workers:
        assert w.address in out and w.scheduler == scheduler
    assert "Storage tiers:" in out
    with Client(scheduler, set_as_default=False) as client:
        for directory in client.run(lambda dask_worker: dask_worker.local_directory).values():
            assert directory in out
    assert "Links: not measured" in out

    assert registry("registry", "probe", "--db", url, "--scheduler", scheduler,
                    "--bytes", "1MiB") == 0
    out = capsys.readouterr().out
    assert "Measured 2 link(s) with 1 MiB transfers." in out
    assert "bandwidth GB/s" in out and "latency ms" in out
    with open_db(url).session() as session:
        assert len(session.exec(select(Link)).all()) == 2

    # Without --scheduler, show reads every registered cluster from the database.
    assert registry("registry", "show", "--db", url) == 0
    out = capsys.readouterr().out
    assert f"Scheduler {scheduler}: 2 worker(s) running, 0 gone" in out
    assert "bandwidth GB/s" in out and "Links: not measured" not in out


def test_probe_needs_a_scheduler(url, monkeypatch):
    monkeypatch.delenv("DEEPX_SCHEDULER", raising=False)
    with pytest.raises(ClusterError, match="--scheduler ADDRESS or DEEPX_SCHEDULER"):
        registry("registry", "probe", "--db", url)


def test_bad_size_is_an_argument_error(url, capsys):
    with pytest.raises(SystemExit):
        registry("registry", "probe", "--db", url, "--bytes", "lots")
    assert "cannot read 'lots' as a size" in capsys.readouterr().err
