"""The shape of the core (issue 47): at most 6 modules at its top, no import circle, no arrow up into the run or the
commands, no file over 450 lines -- checked by tools/house.py, which must also see what it claims to see."""

from __future__ import annotations

from pathlib import Path

from tools import house

ROOT = Path(__file__).resolve().parents[1]


def test_the_core_keeps_its_shape():
    assert house.report(ROOT) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / house.PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p.parent for p in (tmp_path / house.PACKAGE).rglob("*.py")}:
        (folder / "__init__.py").touch()
    return tmp_path


def test_a_lazy_import_still_closes_a_circle(tmp_path):
    root = _package(tmp_path, {
        "data/tasks.py": "from openmanus_rl_core.data.layout import read\n",
        "data/layout.py": "def read():\n    from openmanus_rl_core.data import tasks  # late, still an arrow\n",
    })
    assert house.report(root) == ["import circle: openmanus_rl_core.data.layout <-> openmanus_rl_core.data.tasks"]


def test_type_checking_and_relative_imports_are_arrows_too(tmp_path):
    root = _package(tmp_path, {
        "rollout/loop.py": "from .episodes import Runner\n",
        "rollout/episodes.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from openmanus_rl_core.rollout.loop import Loop\n",
    })
    assert house.report(root) == ["import circle: openmanus_rl_core.rollout.episodes <-> openmanus_rl_core.rollout.loop"]
    (root / house.PACKAGE / "rollout/episodes.py").write_text("x = 1\n")
    assert house.report(root) == []


def test_an_arrow_up_a_long_file_and_a_crowded_top_are_named(tmp_path):
    root = _package(tmp_path, {
        "workers/actor.py": "import openmanus_rl_core.run.trainer\n",
        "run/trainer.py": "x = 1\n" * (house.MAX_LINES + 1),
        **{f"m{i}.py": "" for i in range(house.MAX_TOP_LEVEL_MODULES + 1)},
    })
    problems = house.report(root)
    assert problems[0].startswith(f"{house.MAX_TOP_LEVEL_MODULES + 1} modules at the top of openmanus_rl_core")
    assert problems[1:] == ["arrow up: openmanus_rl_core.workers.actor imports openmanus_rl_core.run.trainer",
                            f"openmanus_rl_core/run/trainer.py: {house.MAX_LINES + 1} lines (at most {house.MAX_LINES})"]
