"""Every `DEEPX_*` setting is checked when it is read (`deepx_flow/config.py`): a value outside
what its setting allows is one `SettingsError` line naming the variable and the range, never
a raw ValueError or a silently absurd plan; an unset or empty variable is the default. The
README's table of allowed values is the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import deepx_flow as dx
from deepx_flow.config import (LARGEST_INT, READERS, Address, Flag, Number, Settings, Text,
                               settings)

README = Path(__file__).resolve().parents[1] / "README.md"
BY_VARIABLE = {r.variable: r for r in READERS}
NUMBERS = [r for r in READERS if isinstance(r.kind, Number)]


def bad_values(kind) -> list[str]:
    """Text each setting of `kind` must refuse."""
    if isinstance(kind, Flag):
        return ["maybe", "2", "-1", "nan"]
    if isinstance(kind, Text):
        return ["localhost:5006", "ftp://x"] if kind.prefixes else []
    if isinstance(kind, Address):
        return ["abc", "tcp://10.0.0.1", "tcp://h:0", "tcp://h:99999", "foo://h:1", "h:port"]
    out = ["abc", "nan", "inf", "-inf", "1e400", "-1", "1 2", "0x10"]
    if kind.above:  # its lowest end, excluded
        out.append(f"{kind.low:g}")
    elif kind.low >= 1:  # just below its lowest end
        out.append(f"{kind.low - 1:g}")
    if (kind.above or kind.low > 0) and "0" not in out:
        out.append("0")
    if kind.kind is int:
        out += ["1.5", "1e3", str(2**70), str(LARGEST_INT + 1)]
    else:
        out.append(repr(kind.high * 2))
    return out


CASES = [(r.variable, text) for r in READERS for text in bad_values(r.kind)]


@pytest.mark.parametrize("variable, text", CASES)
def test_a_bad_value_is_one_line_naming_the_variable_and_the_range(monkeypatch, variable,
                                                                   text):
    monkeypatch.setenv(variable, text)
    with pytest.raises(dx.SettingsError) as info:
        settings()
    message = str(info.value)
    assert message == (f"{variable} must be {BY_VARIABLE[variable].kind.allowed}, got "
                       f"{text!r}")
    assert "\n" not in message and info.value.exit_code == 2


def test_the_reported_cases_are_among_them():
    """Issue 30, item 7: these passed silently or escaped as a raw ValueError."""
    for variable in ("DEEPX_MIN_CHUNK_BYTES", "DEEPX_CHUNKS_PER_THREAD", "DEEPX_REDUCE_FANIN"):
        assert {(variable, "0"), (variable, "-1"), (variable, "nan"),
                (variable, "1e400")} <= set(CASES)
    assert {("DEEPX_MEMORY_FRACTION", v) for v in ("abc", "-1", "0", "nan", "1e400")} \
        <= set(CASES)


@pytest.mark.parametrize("reader", NUMBERS, ids=lambda r: r.variable)
def test_the_ends_of_a_range_are_allowed(monkeypatch, reader):
    kind = reader.kind
    ends = [kind.high] + ([] if kind.above else [kind.low])
    for end in ends:
        text = str(int(end)) if kind.kind is int else repr(float(end))
        monkeypatch.setenv(reader.variable, f" {text} ")
        if reader.variable == "DEEPX_HEARTBEAT_S" and end == kind.high:
            # Allowed alone; no timeout can be longer (the checks across settings).
            assert kind.parse(text) == end
            with pytest.raises(dx.SettingsError, match="must be more than DEEPX_HEARTBEAT_S"):
                settings()
            continue
        value = getattr(settings(), reader.field)
        assert type(value) is kind.kind and value == end


@pytest.mark.parametrize("beat, timeout", [("5", "3"), ("5", "5"), ("60", None),
                                           (None, "4.5"), ("0.5", "0.25")])
def test_a_heartbeat_timeout_not_longer_than_the_beat_is_refused(monkeypatch, beat, timeout):
    """Workers are marked seen once a beat: a timeout of a beat or less counts live workers
    gone between beats. Each value is allowed alone, so the line names both variables."""
    for variable, text in (("DEEPX_HEARTBEAT_S", beat), ("DEEPX_HEARTBEAT_TIMEOUT_S", timeout)):
        if text is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, text)
    with pytest.raises(dx.SettingsError) as info:
        settings()
    message = str(info.value)
    shown_beat, shown_timeout = float(beat or Settings.heartbeat_s), \
        float(timeout or Settings.heartbeat_timeout_s)
    assert message.startswith(f"DEEPX_HEARTBEAT_TIMEOUT_S ({shown_timeout:g} s) must be more "
                              f"than DEEPX_HEARTBEAT_S ({shown_beat:g} s)"), message
    assert "\n" not in message and info.value.exit_code == 2


@pytest.mark.parametrize("beat, timeout", [("5", "5.5"), ("0.25", "7.5"), (None, "5.01"),
                                           ("59", None)])
def test_a_heartbeat_timeout_longer_than_the_beat_is_read(monkeypatch, beat, timeout):
    for variable, text in (("DEEPX_HEARTBEAT_S", beat), ("DEEPX_HEARTBEAT_TIMEOUT_S", timeout)):
        if text is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, text)
    got = settings()
    assert (got.heartbeat_s, got.heartbeat_timeout_s) == (
        float(beat or Settings.heartbeat_s), float(timeout or Settings.heartbeat_timeout_s))


@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.variable)
@pytest.mark.parametrize("text", ["", "   "])
def test_an_empty_variable_is_the_default(monkeypatch, reader, text):
    monkeypatch.setenv(reader.variable, text)
    assert getattr(settings(), reader.field) == getattr(Settings(), reader.field)


def test_every_field_has_a_variable_and_values_are_read():
    fields = set(Settings.__dataclass_fields__)
    assert {r.field for r in READERS} == fields
    assert len({r.variable for r in READERS}) == len(READERS)
    assert all(r.variable.startswith("DEEPX_") for r in READERS)


@pytest.mark.parametrize("variable, text, value", [
    ("DEEPX_MEMORY_FRACTION", "0.25", 0.25),
    ("DEEPX_MIN_CHUNK_BYTES", "1_048_576", 2**20),
    ("DEEPX_RECORD", "Off", False),
    ("DEEPX_RECORD", "yes", True),
    ("DEEPX_DASHBOARD_URL", "https://dash.example/", "https://dash.example"),
    ("DEEPX_BUFFER_POOL_BYTES", "0", 0),
    ("DEEPX_PROGRESS_AFTER_S", "0", 0.0),
    ("DEEPX_SCHEDULER", " tcp://10.0.0.1:8786 ", "tcp://10.0.0.1:8786"),
])
def test_good_values_are_read(monkeypatch, variable, text, value):
    monkeypatch.setenv(variable, text)
    assert getattr(settings(), BY_VARIABLE[variable].field) == value


def test_the_readme_lists_every_setting_with_what_it_allows():
    text = README.read_text()
    rows = dict(re.findall(r"^\| `(DEEPX_[A-Z_]+)` \| ([^|]+?) \|$", text, re.M))
    assert rows == {r.variable: r.kind.allowed for r in READERS}

