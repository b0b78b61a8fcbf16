"""Names holding terminal control sequences (ESC with CSI and OSC, BEL, CR, BS, C1 controls,
bidirectional overrides) are shown escaped wherever text reaches a terminal: `plan.explain()`,
the text tables, and everything the command line prints, its error lines included. No raw
control character reaches its output, and each name is still recognisable in its escaped
form."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
from hypothesis import given, strategies as st

import deepx_flow as dx
from deepx_flow.meta import open_db, queries
from deepx_flow.terminal_text import escaped
from deepx_flow.text_table import text_table

# An OSC 8 link, a clear-screen CSI, BEL, CR, BS, a C1 CSI and a right-to-left override.
EVIL = "e\x1b]8;;http://evil\x07click\x1b]8;;\x07\u202eab\r\x08\x1b[2J\x9b"
SHOWN = r"e\x1b]8;;http://evil\x07click\x1b]8;;\x07\u202eab\r\x08\x1b[2J\x9b"
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def is_control(char: str) -> bool:
    """What a terminal may act on: Unicode's control characters (C0, DEL, C1), its
    bidirectional formatting characters, and its line and paragraph separators."""
    return unicodedata.category(char) in ("Cc", "Zl", "Zp") or char in BIDI


def assert_clean(text: str, keep: str = "\n") -> None:
    raw = sorted({c for c in text if is_control(c) and c not in keep})
    assert not raw, f"raw control characters {raw!r} in {text[:2000]!r}"


@given(st.text())
def test_escaped_text_holds_no_control_character(text):
    shown = escaped(text)
    assert_clean(shown, keep="")
    if not any(is_control(c) for c in text):
        assert shown == text  # nothing else changes


def test_escapes_are_written_as_repr_writes_them():
    assert escaped(EVIL) == SHOWN
    assert escaped("a\tb\nc", keep="\n") == "a\\tb\nc"


def test_text_tables_escape_cells_and_title_and_keep_columns_aligned():
    table = text_table(("name", "n"), [(EVIL, 1), ("plain", 22)], title=f"title {EVIL}")
    assert_clean(table, keep="\n")
    lines = table.splitlines()
    assert lines[0] == f"title {SHOWN}" and lines[3].startswith(SHOWN)
    assert len(lines[3]) - 1 == lines[4].index("22")  # the escaped name's width counts


def evil_spec(extra: str = "") -> str:
    return json.dumps({"deepx": 1, "inputs": {EVIL: {"shape": [40, 3], "dtype": "float64"}},
                       "nodes": [{"id": EVIL + "2", "op": "exp", "args": [EVIL + extra]}],
                       "outputs": [{EVIL + "out": EVIL + "2"}]})


def test_explain_shows_names_escaped():
    text = dx.compile(dx.from_yaml(evil_spec())).explain()
    assert_clean(text)
    assert f"{SHOWN}2 -> {SHOWN}out" in text


def cli(*args, timeout=300, env=None):
    res = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", *args],
                         capture_output=True, text=True, timeout=timeout, env=env)
    assert_clean(res.stdout)
    assert_clean(res.stderr)
    return res


def test_cli_explain_and_its_errors_show_names_escaped(tmp_path):
    spec = tmp_path / "evil.yaml"
    spec.write_text(evil_spec())
    res = cli("explain", str(spec))
    assert res.returncode == 0, res.stderr
    assert f"{SHOWN}2 -> {SHOWN}out" in res.stdout
    spec.write_text(evil_spec(extra="missing"))  # an operand no node defines
    res = cli("explain", str(spec))
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1
    assert "missing input" in res.stderr and SHOWN in res.stderr
    # A message that names a path as given, not through repr: CR would have cut it short.
    # (The name without its slashes, which a path would take for folders.)
    res = cli("explain", f"{tmp_path}/no{EVIL.replace('/', '')}such.yaml")
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1
    assert f"no{SHOWN.replace('/', '')}such.yaml: no such graph spec file" in res.stderr


def test_a_run_and_its_records_show_names_escaped(tmp_path, scheduler, db_url):
    spec = tmp_path / "evil.yaml"
    spec.write_text(evil_spec())
    x = np.random.default_rng(0).standard_normal((40, 3))
    np.save(tmp_path / "x.npy", x)
    res = cli("run", str(spec), "-i", f"{EVIL}={tmp_path / 'x.npy'}", "--scheduler", scheduler,
              "--db", db_url, "--no-progress")
    assert res.returncode == 0, res.stderr
    assert f"{SHOWN}out: shape (40, 3) float64" in res.stdout
    (run,) = queries.list_runs(open_db(db_url))
    assert cli("runs", "--db", db_url).returncode == 0
    show = cli("runs", "show", run.id, "--tasks", "--db", db_url)
    assert show.returncode == 0, show.stderr
    assert re.search(re.escape(SHOWN) + r"2@\w+", show.stdout)  # the task keys
    placed = cli("placement", run.id, "--all", "--db", db_url)  # released chunks too
    assert placed.returncode == 0 and SHOWN in placed.stdout, placed.stderr


def test_registry_shows_worker_names_escaped(db_url):
    from distributed import Scheduler, SpecCluster, Worker

    workers = {EVIL: {"cls": Worker, "options": {"nthreads": 1}}}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0"}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster:
        res = cli("registry", "show", "--scheduler", cluster.scheduler_address, "--db",
                  db_url)
    assert res.returncode == 0, res.stderr
    assert SHOWN in res.stdout


PIPELINE = """\
import deepx_flow as dx


@dx.asset(partitions=dx.StaticPartitions({keys!r}))
def sales(partition):
    return dx.arange(4, dtype="float64") * 2.0


defs = dx.Definitions(assets=[sales])
"""


def test_asset_tables_show_partition_keys_escaped(tmp_path, db_url):
    (tmp_path / "pipeline.py").write_text(PIPELINE.format(keys=[EVIL.replace("/", ""), "b"]))
    env = {**os.environ, "DEEPX_DB_URL": db_url, "DEEPX_ASSET_ROOT": str(tmp_path / "assets")}
    listing = cli("assets", "list", "-m", str(tmp_path / "pipeline.py"), env=env)
    assert listing.returncode == 0, listing.stderr
    status = cli("assets", "status", "-m", str(tmp_path / "pipeline.py"), env=env)
    assert status.returncode == 0, status.stderr
    assert f"[{SHOWN.replace('/', '')}] never materialized" in status.stdout
