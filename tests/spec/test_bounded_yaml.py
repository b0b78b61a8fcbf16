"""The bounded YAML loader gives what `yaml.safe_load` gives, for any document the specs'
writer produces and for YAML's other forms (anchors, merge keys, tags), while building values
itself (issue 30, item 9: a 20,000-node spec is read in linear time, fast)."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from deepx_flow.errors import SpecError
from deepx_flow.spec.bounded_yaml import load

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                         | st.dictionaries(st.text(max_size=8) | st.integers(), inner,
                                           max_size=5), max_leaves=40)


def same(a, b) -> bool:
    """Equal, NaN equal to NaN, types equal (1 is not 1.0 nor True)."""
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


@given(documents, st.sampled_from([None, True, False]))
def test_what_the_writer_writes_reads_as_safe_load_reads_it(value, flow):
    text = yaml.safe_dump(value, default_flow_style=flow, sort_keys=False)
    assert same(load(text, 100_000), yaml.safe_load(text))


@pytest.mark.parametrize("text", [
    "a: &x [1, 2, {b: 3}]\nc: *x\n",
    "base: &b {e: 1, f: 2}\nd: {<<: *b, f: 3}\n",
    "t: 2001-12-14\nbin: !!binary aGVsbG8=\nn: ~\nb: yes\nf: .inf\ng: -.nan\nh: 1_000\n"
    "i: 0x1f\no: 0o17\ns: !!set {a, b}\nom: !!omap [a: 1]\np: !!pairs [a: 1]\n",
    "k: !!str 12\nj: !!int '7'\nq: !!float '1'\n",
    "a: 1\na: 2\n", "[1, 2.5, '3', null, true]", "'just a string'", "", "[]", "{}",
    "{a: {b: {c: [1, [2, [3]]]}}}",
])
def test_yamls_other_forms_read_as_safe_load_reads_them(text):
    got = load(text, 100_000)
    assert same(got, yaml.safe_load(text))
    if isinstance(got, dict) and "c" in got and "a" in got:
        assert got["c"] is got["a"]  # an alias is its anchor's value again, not a copy


@pytest.mark.parametrize("text", ["? [1, 2]\n: 3\n", "x: !foo bar\n", "a: [1, 2\n",
                                  "a: !!seq abc\n", "a: !!map abc\n", "a: !!int [1]\n"])
def test_what_safe_load_refuses_is_refused_alike(text):
    # The same parser (libyaml's where PyYAML has it), so the same words.
    parser = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
    with pytest.raises(yaml.YAMLError) as theirs:
        yaml.load(text, Loader=parser)
    with pytest.raises(yaml.YAMLError) as ours:
        load(text, 100_000)
    assert type(ours.value) is type(theirs.value)
    assert ours.value.problem == theirs.value.problem


@pytest.mark.parametrize("text", ["a: &n {<<: {x: 1}, y: [*n]}\n", "a: &n [{<<: {}, y: *n}]\n",
                                  "a: &n [1, [2, *n]]\n"])
def test_an_alias_inside_its_own_anchor_is_refused_also_under_merge_keys(text):
    with pytest.raises(SpecError, match="contains itself"):
        load(text, 100_000)
