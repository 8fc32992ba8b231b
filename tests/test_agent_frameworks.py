"""Each agent framework as its own docs write it (examples/agents/), trained 2 steps through ``agent.command`` on
the embedded default model, with no env_error episode:

- the OpenAI Agents SDK (``tool_choice="required"``, on the Responses API),
- LangGraph with LangChain's ChatOpenAI (``with_structured_output``: a strict ``json_schema`` response format),
- pydantic-ai (a typed output: a required ``final_result`` tool, on the Responses API),
- smolagents (a ``ToolCallingAgent``: every step a required tool call),
- the ``anthropic`` SDK (``tool_choice`` naming the tool, on the Messages API).

Each agent posts ``success`` when its framework accepted the model's output (a valid tool call, or a reply that
validates against the schema), so the run's success rates count the valid outputs. A random tiny policy writes a
valid call only under grammar-constrained decoding: with it, at least 95% of the episodes are valid; with
``agent.constrained=false`` the same run misses that bar, so the test tells the two apart.

Each framework is installed, pinned, into a venv of its own (the agent is a separate process: the venv holds the
framework, not this project), made once under ``~/.cache/omrl-test-venvs/<name>`` and reused; making one needs
PyPI. Marked ``long`` (opt-in: ``make test-long``): each test takes 20-80 s here once its venv is made (the Agents
SDK's the longest), 8 minutes for all ten.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_resume_config import SMALL

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[1]
VENVS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omrl-test-venvs"
BAR = 0.95  # the share of episodes whose output the framework accepted, under constrained decoding
# A strict tool call in the tiny model's byte-level BPE takes tens of tokens. smolagents' system prompt alone, and
# pydantic-ai's retry after an invalid reply (the reply and a retry prompt), are longer than the default 1,024
# positions: a refused call would end the episode as env_error instead of as an invalid output.
RUN = ["trainer.total_steps=2", "rollout.max_new_tokens=192", "model.tiny.max_position_embeddings=4096"]


@dataclass(frozen=True)
class Framework:
    venv: str  # the cached venv's folder name: the framework and its version
    requirements: tuple[str, ...]
    script: str  # under examples/agents/


FRAMEWORKS = {
    "openai_agents": Framework("openai-agents-0.24.0", ("openai-agents==0.24.0",), "openai_agents_agent.py"),
    "langgraph": Framework("langgraph-1.2.24", ("langchain-openai==1.7.4", "langgraph==1.2.24"),
                           "langgraph_agent.py"),
    "pydantic_ai": Framework("pydantic-ai-slim-2.68.0", ("pydantic-ai-slim[openai]==2.68.0",), "pydantic_ai_agent.py"),
    "smolagents": Framework("smolagents-1.26.0", ("smolagents[openai]==1.26.0",), "smolagents_agent.py"),
    "anthropic": Framework("anthropic-2.14.0", ("anthropic==2.14.0",), "anthropic_agent.py"),
}


def framework_python(fw: Framework) -> Path:
    """The python of ``fw``'s cached venv, made (and its requirements installed from PyPI) when it is missing or
    was made for other requirements."""
    venv = VENVS / fw.venv
    stamp, python = venv / ".requirements", venv / "bin" / "python"
    wanted = "\n".join(fw.requirements)
    if stamp.is_file() and stamp.read_text() == wanted and python.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", *fw.requirements], capture_output=True,
                         text=True, timeout=1200)
    assert pip.returncode == 0, f"pip install {' '.join(fw.requirements)} failed:\n{pip.stderr[-2000:]}"
    stamp.write_text(wanted)
    return python


def _train(name: str, run: Path, constrained: bool, command_here) -> list[dict]:
    fw = FRAMEWORKS[name]
    command = f"{framework_python(fw)} {ROOT / 'examples' / 'agents' / fw.script}"
    out = command_here(["train", *SMALL, *RUN, f"trainer.run_dir={run}", f"agent.command={command}",
                        f"agent.constrained={str(constrained).lower()}"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    return rows


def _episodes(rows: list[dict]) -> list[tuple[float, int, float]]:
    """(success rate, episodes, env_error share) of each rollout of the run: the training steps' (2 tasks x 2
    samples) and the validations' (2 tasks), the warm-up's included."""
    out = []
    for r in rows:
        for prefix, n in (("rollout/", 4), ("val/", 2), ("warmup/val/", 2)):
            if f"{prefix}success_rate" in r:
                out.append((r[f"{prefix}success_rate"], n, r[f"{prefix}termination/env_error"]))
    return out


def _valid_share(rollouts: list[tuple[float, int, float]]) -> float:
    return sum(rate * n for rate, n, _ in rollouts) / sum(n for _, n, _ in rollouts)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_the_frameworks_agent_trains_and_its_outputs_are_valid_under_constrained_decoding(name, tmp_path, ray_local,
                                                                                          command_here):
    rollouts = _episodes(_train(name, tmp_path / "run", True, command_here))
    assert len(rollouts) == 5 and sum(n for _, n, _ in rollouts) == 14
    assert [err for _, _, err in rollouts] == [0.0] * 5  # no env_error episode
    assert _valid_share(rollouts) >= BAR


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_without_constrained_decoding_the_same_agent_misses_the_bar(name, tmp_path, ray_local, command_here):
    rollouts = _episodes(_train(name, tmp_path / "run", False, command_here))
    assert [err for _, _, err in rollouts] == [0.0] * 5  # an invalid output is the agent's answer, not a crash
    assert _valid_share(rollouts) < BAR
