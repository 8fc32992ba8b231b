"""The OpenAI Agents SDK as its quickstart writes it: an ``Agent`` with a function tool, run by ``Runner.run_sync``.
The model must answer with a tool call (``tool_choice="required"``); the tool's result ends the run.

    openmanus-rl train env=key_door agent.command="python examples/agents/openai_agents_agent.py"

The SDK reads OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_DEFAULT_MODEL and OPENAI_AGENTS_DISABLE_TRACING, which the
trainer sets for each episode: nothing here names the gateway. The task row (OMRL_TASK) picks the door's side;
the episode posts reward 1 for walking through it, and success when the SDK ran the tool (a valid call).
"""
import json
import os
from typing import Literal

from agents import Agent, ModelSettings, Runner, function_tool
from openai import OpenAI

SIDES = ("north", "east", "south", "west")


@function_tool
def move(direction: Literal["north", "east", "south", "west"]) -> str:
    """Walk out of the room on one side."""
    return direction


agent = Agent(
    name="Explorer",
    instructions="You are in a room with one door. Leave through it with the move tool.",
    tools=[move],
    model_settings=ModelSettings(tool_choice="required"),
    tool_use_behavior="stop_on_first_tool",
)

if __name__ == "__main__":
    task = json.loads(os.environ["OMRL_TASK"])
    door = SIDES[task["seed"] % len(SIDES)]
    result = Runner.run_sync(agent, f"The door is on the {door} side.", max_turns=2)
    called = any(item.type == "tool_call_output_item" for item in result.new_items)
    reward = float(called and result.final_output == door)
    OpenAI().post("/rl/reward", body={"reward": reward, "success": called}, cast_to=object)
