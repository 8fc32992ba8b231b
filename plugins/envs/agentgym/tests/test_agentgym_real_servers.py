"""Opt-in: the client against AgentGym's REAL TextCraft and BabyAI servers (not part of `make test`, which has
no AgentGym install). Start the servers as docs/agentgym.md says, then:

    AGENTGYM_TEXTCRAFT_URL=http://127.0.0.1:36101 AGENTGYM_BABYAI_URL=http://127.0.0.1:36102 \\
        .venv/bin/python -m pytest -q plugins/envs/agentgym/tests/test_agentgym_real_servers.py

Each test is skipped when its URL variable is not set.
"""

from __future__ import annotations

import os

import pytest
import requests

from openmanus_rl_env_agentgym import AgentGymEnv

TEXTCRAFT = os.environ.get("AGENTGYM_TEXTCRAFT_URL")
BABYAI = os.environ.get("AGENTGYM_BABYAI_URL")


@pytest.mark.skipif(not TEXTCRAFT, reason="set AGENTGYM_TEXTCRAFT_URL to a running AgentGym TextCraft server")
def test_real_textcraft_wraps_indices_closes_envs_and_ends_with_the_goal():
    goals = {}
    for index in (0, 544, 518, 518 + 544):
        env = AgentGymEnv("textcraft", base_url=TEXTCRAFT, timeout=30)
        first = env.reset(index)
        goals[index] = first.rstrip().splitlines()[-1]
        assert first.startswith("Crafting commands:") and goals[index].startswith("Goal: craft ")
        assert env._has_close()  # its OpenAPI schema lists POST /close
        env.close()
    assert goals[0] == goals[544] and goals[518] == goals[518 + 544]  # 544 goals, then it wraps
    # /close really releases the env: closing it again answers false
    created = requests.post(TEXTCRAFT + "/create", json={}, timeout=30).json()["id"]
    assert requests.post(TEXTCRAFT + "/close", json={"id": created}, timeout=30).json() is True
    assert requests.post(TEXTCRAFT + "/close", json={"id": created}, timeout=30).json() is False


@pytest.mark.skipif(not BABYAI, reason="set AGENTGYM_BABYAI_URL to a running AgentGym BabyAI server")
def test_real_babyai_mission_0_finishes_with_reward_0_8875_and_counts_as_success():
    env = AgentGymEnv("babyai", base_url=BABYAI, timeout=30)
    first = env.reset(0)
    assert first.startswith("Your goal: go to the red ball")
    result = env.step("go to red ball 1")
    env.close()
    assert result.done and result.reward == pytest.approx(0.8875) and result.info["success"] is True
    assert env._has_close()
