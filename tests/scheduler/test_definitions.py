"""`dx.schedule` and `Definitions(schedules=...)`: mistakes fail where the project loads,
naming the schedule."""

from __future__ import annotations

import pytest

import deepx_flow as dx


@dx.asset
def features():
    return dx.ones((4, 4))


@dx.asset
def embeddings(features):
    return features * 2


ASSETS = [features, embeddings]


def test_a_schedule_is_a_checked_value():
    s = dx.schedule("0  2 * * *", select="embeddings")
    assert (s.name, s.cron, s.selection, s.catchup, s.timezone) == \
        ("materialize_embeddings", "0 2 * * *", "embeddings", "latest", "UTC")
    assert dx.schedule("@daily").name == "materialize_all"
    assert dx.schedule("*/10 * * * * *", ["+embeddings", "features"]).selection == \
        "+embeddings, features"
    defs = dx.Definitions(assets=ASSETS, schedules=[s, dx.schedule("0 3 * * *", "+embeddings",
                                                                   name="upstream_too")])
    assert [x.name for x in defs.schedules] == ["materialize_embeddings", "upstream_too"]
    with pytest.raises(AttributeError):
        s.cron = "* * * * *"


@pytest.mark.parametrize("kwargs, message", [
    ({"cron": "0 25 * * *"}, "schedule nightly: cannot read cron '0 25 \\* \\* \\*'"),
    ({"cron": "0 2 * *"}, "must have 5 fields .* or 6 \\(with seconds last\\)"),
    ({"cron": "0 0 2 * * * 2030"}, "must have 5 fields"),
    ({"cron": "0 0 30 2 *"}, "schedule nightly: cron '0 0 30 2 \\*' never fires"),
    ({"cron": None}, "must have 5 fields"),
    ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
    ({"cron": "0 2 * * *", "catchup": "some"}, "catchup must be one of latest, all"),
    ({"cron": "0 2 * * *", "name": "nightly run"}, "must be an identifier"),
    ({"cron": "0 2 * * *", "select": ""}, "non-empty"),
])
def test_bad_schedules_say_what_is_wrong(kwargs, message):
    kwargs.setdefault("name", "nightly")
    with pytest.raises(dx.GraphError, match=message):
        dx.schedule(**kwargs)


def test_definitions_check_schedules_against_the_assets():
    with pytest.raises(dx.GraphError, match="schedule materialize_embedings: no asset named "
                                            "'embedings' \\(did you mean 'embeddings'\\?\\)"):
        dx.Definitions(assets=ASSETS, schedules=[dx.schedule("0 2 * * *", "embedings")])
    with pytest.raises(dx.GraphError, match="two schedules are named 'materialize_features'"):
        dx.Definitions(assets=ASSETS, schedules=[dx.schedule("0 2 * * *", "features"),
                                                 dx.schedule("0 3 * * *", "features")])
    with pytest.raises(dx.GraphError, match="takes dx.schedule\\(...\\) values, got '0 2'"):
        dx.Definitions(assets=ASSETS, schedules=["0 2"])
    with pytest.raises(dx.GraphError, match="selection '\\*' picks no assets"):
        dx.Definitions(assets=[], schedules=[dx.schedule("0 2 * * *")])
