"""Every ``openmanus-rl`` job command written in the README and docs/*.md composes as written: its keys exist, its
options resolve and the command reads every key it sets (issue 47: the docs follow the moves). Running them is the
walks' job (tests/test_readme_use.py, tests/test_docs_writing_plugins.py); this checks all of them, cheaply.

Lines with a placeholder (``<run dir>``, ``...``, ``[optional]``, ``seed=S``) are skipped; docs/writing-plugins.md's commands
name the plugin its own test installs, and are checked there."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from openmanus_rl_core.cli import check_command_keys
from openmanus_rl_core.config.loading import compose

ROOT = Path(__file__).resolve().parents[1]
JOBS = ("train", "eval", "rollout", "export", "serve")
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|\[[^\]=]*\]|=[A-Z]+(\s|$)")  # <x>, ..., [optional], =W (a folder named above)


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """``(where, command, overrides)`` for each job command in a code block of the README and docs/*.md."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if path.name == "writing-plugins.md":
            continue
        lines, in_block = path.read_text().splitlines(), False
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.lstrip().startswith("```"):
                in_block = not in_block
            elif in_block and re.match(r"\s*(\$ )?openmanus-rl (" + "|".join(JOBS) + r")\b", line):
                start = i + 1
                while line.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line.rstrip()[:-1] + " " + lines[i].strip()
                words = shlex.split(line, comments=True)
                words = words[1:] if words[0] == "$" else words
                if not PLACEHOLDER.search(" ".join(words)):
                    overrides = [w for w in words[2:] if w not in ("--cfg", "job")]
                    found.append((f"{path.relative_to(ROOT)}:{start}", words[1], overrides))
            i += 1
    return found


def _parsed(value: str):
    """An override's value as Hydra reads it (YAML, where ``1e-4`` is a number too)."""
    parsed = yaml.safe_load(value)
    try:
        return float(parsed) if isinstance(parsed, str) else parsed
    except ValueError:
        return parsed


COMMANDS = documented_commands()


def test_the_docs_hold_the_commands_this_test_reads():
    assert len(COMMANDS) >= 40
    assert {"train", "eval", "rollout", "export"} <= {command for _, command, _ in COMMANDS}


@pytest.mark.parametrize("where,command,overrides", COMMANDS, ids=[where for where, _, _ in COMMANDS])
def test_a_documented_command_composes_as_written(where, command, overrides):
    check_command_keys(command, overrides)
    cfg = compose(overrides)
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if "." in key and not key.startswith("experiment"):
            node = cfg
            for part in key.split("."):
                node = node[part]
            assert node == _parsed(value) or value.startswith(("[", "{", "${")), (where, override, node)
