"""Registry behaviour on bad input: duplicate names, unknown names, broken plugins."""

import importlib_metadata
import pytest

from openmanus_rl_core.plugin import registry as reg
from openmanus_rl_core.plugin.registry import (
    AmbiguousPluginError,
    PluginEntry,
    PluginLoadError,
    Registry,
    UnknownPluginError,
)


def _fake_entries(monkeypatch, entries):
    # Unit tests at the edge: the end-to-end test in test_third_party_plugin.py uses a real distribution.
    monkeypatch.setattr(reg, "entries", lambda kind=None: [e for e in entries if kind in (None, e.kind)])


def test_same_name_from_two_distributions_names_both_and_how_to_qualify(monkeypatch):
    a = PluginEntry("env", "maze", "json:loads", "dist-alpha", "1.0")
    b = PluginEntry("env", "maze", "json:dumps", "dist-beta", "2.0")
    _fake_entries(monkeypatch, [a, b])
    r = Registry("env")
    with pytest.raises(AmbiguousPluginError) as info:
        r.get("maze")
    msg = str(info.value)
    assert "dist-alpha" in msg and "dist-beta" in msg
    assert "'dist-alpha:maze'" in msg and "'dist-beta:maze'" in msg
    import json

    assert r.get("dist-beta:maze") is json.dumps
    assert r.get("Dist_Alpha:maze") is json.loads  # distribution names compare normalised


def test_unknown_name_lists_close_matches_and_installed_names(monkeypatch):
    _fake_entries(monkeypatch, [
        PluginEntry("env", "textcraft", "json:loads", "d", "1"),
        PluginEntry("env", "textworld", "json:loads", "d", "1"),
        PluginEntry("env", "webshop", "json:loads", "d", "1"),
    ])
    with pytest.raises(UnknownPluginError) as info:
        Registry("env").get("textcraf")
    msg = str(info.value)
    assert "Did you mean 'textcraft'" in msg
    assert "Installed env names: textcraft, textworld, webshop" in msg


def test_unknown_kind_is_rejected_with_the_kinds():
    with pytest.raises(UnknownPluginError, match="unknown plugin kind 'envz'.*env, reward"):
        Registry("envz")


def test_broken_plugin_raises_only_when_used_and_names_dist_and_entry_point(monkeypatch):
    good = PluginEntry("template", "good", "json:loads", "good-dist", "1.0")
    bad = PluginEntry("template", "bad", "no_such_module_xyz.sub:Thing", "bad-dist", "0.3")
    _fake_entries(monkeypatch, [good, bad])
    r = Registry("template")
    import json

    assert r.get("good") is json.loads
    with pytest.raises(PluginLoadError) as info:
        r.get("bad")
    msg = str(info.value)
    assert "bad-dist 0.3" in msg
    assert "bad = no_such_module_xyz.sub:Thing" in msg and "openmanus_rl.templates" in msg
    assert "ModuleNotFoundError" in msg
    assert r.get("good") is json.loads  # the broken one takes nothing down


def test_static_problem_detects_missing_module_and_attribute_without_importing():
    assert PluginEntry("env", "x", "json:loads", "d", "1").static_problem() is None
    assert "not found" in PluginEntry("env", "x", "no_such_mod_q:f", "d", "1").static_problem()
    missing_attr = PluginEntry("env", "x", "openmanus_rl_core.protocols:NoSuchThing", "d", "1")
    assert "defines no 'NoSuchThing'" in missing_attr.static_problem()


def test_build_reports_bad_constructor_arguments(monkeypatch):
    _fake_entries(monkeypatch, [PluginEntry("allocator", "frac", "fractions:Fraction", "d", "1")])
    with pytest.raises(TypeError, match="cannot build allocator 'frac' with arguments \\['bogus'\\]"):
        Registry("allocator").build("frac", bogus=1)


def test_real_entry_points_of_the_core_are_listed():
    names = {e.name for e in reg.entries("advantage")}
    assert {"gae", "grpo", "rloo", "reinforce_plus_plus", "gigpo"} <= names
    assert all(e.dist == "openmanus-rl-core" for e in reg.entries("advantage"))
    # and they match what importlib-metadata itself reports
    raw = {ep.name for ep in importlib_metadata.entry_points(group="openmanus_rl.advantages")}
    assert names == raw
