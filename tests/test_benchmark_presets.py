"""Every ``+experiment=`` preset that docs/benchmarks.md lists composes: the config loads and passes every check
(no unknown key, plugin kwargs included), and each value the preset sets is the value the run gets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from openmanus_rl_core.config import load

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
PRESETS = sorted(set(re.findall(r"\+experiment=(\w+)", DOC.read_text())))


def _file(name: str) -> Path:
    (path,) = ROOT.glob(f"plugins/envs/*/openmanus_rl_env_*/configs/experiment/{name}.yaml")
    return path


def _leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_the_page_lists_a_quick_preset_for_each_real_benchmark_it_trains():
    assert {"babyai_goto", "babyai_quick", "textcraft_quick"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_listed_preset_composes_and_every_value_it_sets_arrives(name):
    cfg = load([f"+experiment={name}"])
    preset = yaml.safe_load(_file(name).read_text())
    env = next(d["override /env"] for d in preset.pop("defaults") if isinstance(d, dict) and "override /env" in d)
    assert cfg.env.name == env
    leaves = dict(_leaves(preset))
    assert leaves, name
    for key, value in leaves.items():
        got = cfg
        for part in key.split("."):
            got = got[part] if isinstance(got, dict) else getattr(got, part)
        assert got == value, (name, key)
