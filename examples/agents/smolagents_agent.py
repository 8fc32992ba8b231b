"""smolagents as its guided tour writes it: a ``ToolCallingAgent`` on an ``OpenAIModel``, with ``@tool`` functions.
smolagents asks for every step as a tool call (``tool_choice="required"``); the typed ``final_answer`` tool here
replaces its default one (whose ``answer`` is an unbounded string), so the answer is one of the room's sides.

    openmanus-rl train env=key_door agent.command="python examples/agents/smolagents_agent.py"

The model reads OMRL_MODEL, OPENAI_BASE_URL and OPENAI_API_KEY. The task row (OMRL_TASK) picks the door's side;
the episode posts reward 1 for walking through it, and success when smolagents ran the final answer tool
(a valid call).
"""
import json
import os
from typing import Literal

from openai import OpenAI
from smolagents import OpenAIModel, ToolCallingAgent, tool

SIDES = ("north", "east", "south", "west")


@tool
def final_answer(direction: Literal["north", "east", "south", "west"]) -> str:
    """Leave the room: the final answer.

    Args:
        direction: the side of the room to leave by
    """
    return direction


# One call per step: smolagents refuses a final answer that comes with other calls, and OpenAI's default lets a
# model write several.
model = OpenAIModel(model_id=os.environ["OMRL_MODEL"], api_base=os.environ["OPENAI_BASE_URL"],
                    api_key=os.environ["OPENAI_API_KEY"], parallel_tool_calls=False)
agent = ToolCallingAgent(tools=[final_answer], model=model, max_steps=1, verbosity_level=0)

if __name__ == "__main__":
    task = json.loads(os.environ["OMRL_TASK"])
    door = SIDES[task["seed"] % len(SIDES)]
    answer = agent.run(f"You are in a room with one door, on the {door} side. Leave through it.")
    # Past max_steps smolagents asks once more for a free-text answer; only the tool's answer is a valid one.
    called = any(getattr(step, "is_final_answer", False) for step in agent.memory.steps)
    reward = float(called and answer == door)
    OpenAI().post("/rl/reward", body={"reward": reward, "success": called}, cast_to=object)
