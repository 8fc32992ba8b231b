"""The OpenAI Agents SDK's quickstart (an Agent with a function tool, ``Runner.run_sync``), unchanged, against a
Gateway: the SDK speaks the Responses API (gateway/responses.py). ``openai-agents`` needs ``openai`` 3, which the
core's other users (verifiers) do not admit, so the test makes a venv of its own and installs it there from PyPI
(marked ``long``: opt-in, ``make test-long``). The engine is scripted (test_gateway.py's): a tool call, then an
answer; what is checked is what the SDK prints and what the gateway recorded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from openmanus_rl_core.gateway.episodes import episode_from_record
from test_gateway import gateway, tok  # noqa: F401  (fixtures)

pytestmark = pytest.mark.long

AGENTS = "openai-agents==0.24.0"

QUICKSTART = textwrap.dedent('''
    from agents import Agent, Runner, function_tool


    @function_tool
    def get_weather(city: str) -> str:
        """Returns weather info for the specified city."""
        return f"The weather in {city} is sunny"


    agent = Agent(name="Hello world", instructions="You are a helpful agent.", tools=[get_weather])
    result = Runner.run_sync(agent, "What's the weather in Tokyo?")
    print(result.final_output)
''')


@pytest.fixture(scope="module")
def agents_python(tmp_path_factory):
    venv = tmp_path_factory.mktemp("venv-agents")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", AGENTS], capture_output=True, text=True,
                         timeout=900)
    assert pip.returncode == 0, pip.stderr[-2000:]
    return python


def test_the_agents_sdk_quickstart_runs_unchanged_and_each_model_call_is_recorded(gateway, tok, agents_python,
                                                                                   tmp_path):
    # A reasoning reply: its <think> block comes back to the SDK as a reasoning item, and goes back into the next
    # prompt as the model wrote it.
    call = ('<think>the tool knows</think><tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n'
            '</tool_call>')
    gw = gateway([call, "The weather in Tokyo is sunny."])
    key = gw.open_episode({"task_id": 0})
    script = tmp_path / "quickstart.py"
    script.write_text(QUICKSTART)
    # What an agent command gets, plus the SDK's own switches: its default model and no trace export.
    env = {**os.environ, "OPENAI_BASE_URL": gw.base_url, "OPENAI_API_KEY": key, "OPENAI_DEFAULT_MODEL": "omrl-policy",
           "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(agents_python), str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "The weather in Tokyo is sunny."
    record = gw.close_episode(key)
    first, second = record.calls
    assert first.tools[0]["function"]["name"] == "get_weather"
    assert second.messages[-1] == {
        "role": "tool", "tool_call_id": second.messages[-2]["tool_calls"][0]["id"],
        "content": "The weather in Tokyo is sunny"}
    assert second.messages[-2]["content"] == "<think>the tool knows</think>"
    assert episode_from_record(record).trajectory.info["gateway"] == "continuous"
