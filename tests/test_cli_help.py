"""Each subcommand's --help: its purpose, its main keys with their meaning, and two examples that compose."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from openmanus_rl_core.cli import HELP, JOBS, check_command_keys, key_help
from openmanus_rl_core.config.loading import check, compose


def test_every_command_has_help_with_two_examples_of_itself():
    assert set(HELP) == set(JOBS)
    for command, h in HELP.items():
        assert len(h.examples) == 2 and len(set(h.examples)) == 2
        for example in h.examples:
            assert example.startswith(f"openmanus-rl {command} ")


@pytest.mark.parametrize("command", sorted(JOBS))
def test_the_examples_compose_and_name_only_schema_keys(command):
    """A real example: its overrides compose, pass the config check, and its main keys exist in the schema."""
    for key in HELP[command].keys:
        assert key_help(key)  # KeyError for a key the schema lacks
    for example in HELP[command].examples:
        overrides = shlex.split(example)[1 + len(command.split()):]
        check(compose(overrides), training=command == "train")
        check_command_keys(command, overrides)  # an example sets only keys its command reads
    check_command_keys(command, [f"{key}=x" for key in HELP[command].keys if "." in key])  # so do its main keys


@pytest.mark.parametrize("argv", [["train"], ["data", "make"], ["data", "verify"], ["export"]])
def test_help_prints_the_commands_own_usage_purpose_keys_and_examples(cli_env, argv):
    command = " ".join(argv)
    out = subprocess.run(["openmanus-rl", *argv, "--help"], env=cli_env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith(f"usage: openmanus-rl {command} ")
    assert " ".join(HELP[command].purpose.split()) in " ".join(text.split())
    for key in HELP[command].keys:
        assert f"\n  {key} " in text
    assert "examples:\n  " + "\n  ".join(HELP[command].examples) in text
    assert "Hydra overrides: key=value)" not in text


def test_data_alone_lists_its_actions(cli_env):
    out = subprocess.run(["openmanus-rl", "data", "--help"], env=cli_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "{make,verify,from-rollouts}" in out.stdout
