"""pydantic-ai as its docs write it: an ``Agent`` with a typed output (a pydantic model), run by ``run_sync``.
pydantic-ai asks for the typed output as a tool call it requires (its ``final_result`` tool) and validates it.

    openmanus-rl train env=key_door agent.command="python examples/agents/pydantic_ai_agent.py"

The OpenAI provider reads OPENAI_BASE_URL and OPENAI_API_KEY; the model is ``openai:<OMRL_MODEL>`` (pydantic-ai
speaks the Responses API for it). The task row (OMRL_TASK) picks the door's side; the episode posts reward 1 for
walking through it, and success when pydantic-ai accepted the output (a valid ``Move``).
"""
import json
import os
from typing import Literal

from openai import OpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.exceptions import UnexpectedModelBehavior

SIDES = ("north", "east", "south", "west")


class Move(BaseModel):
    """The side of the room to leave by."""

    direction: Literal["north", "east", "south", "west"]


agent = Agent(f"openai:{os.environ['OMRL_MODEL']}", output_type=Move,
              instructions="You are in a room with one door. Leave through it.")

if __name__ == "__main__":
    task = json.loads(os.environ["OMRL_TASK"])
    door = SIDES[task["seed"] % len(SIDES)]
    try:
        move = agent.run_sync(f"The door is on the {door} side.").output
    except UnexpectedModelBehavior:  # no valid output after pydantic-ai's retries
        move = None
    reward = float(move is not None and move.direction == door)
    OpenAI().post("/rl/reward", body={"reward": reward, "success": move is not None}, cast_to=object)
