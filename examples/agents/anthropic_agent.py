"""The ``anthropic`` SDK as its tool-use docs write it: ``messages.create`` with a tool and a ``tool_choice`` that
requires it.

    openmanus-rl train env=key_door agent.command="python examples/agents/anthropic_agent.py"

``anthropic.Anthropic()`` reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY; the model is OMRL_MODEL. The task row
(OMRL_TASK) picks the door's side; the episode posts reward 1 for walking through it, and success when the reply
held a ``tool_use`` block whose input the tool's schema admits.
"""
import json
import os

import anthropic

SIDES = ("north", "east", "south", "west")
MOVE = {
    "name": "move",
    "description": "Walk out of the room on one side.",
    "input_schema": {"type": "object", "properties": {"direction": {"type": "string", "enum": list(SIDES)}},
                     "required": ["direction"], "additionalProperties": False},
}

if __name__ == "__main__":
    task = json.loads(os.environ["OMRL_TASK"])
    door = SIDES[task["seed"] % len(SIDES)]
    client = anthropic.Anthropic()
    message = client.messages.create(
        model=os.environ["OMRL_MODEL"], max_tokens=256, tools=[MOVE], tool_choice={"type": "tool", "name": "move"},
        system="You are in a room with one door. Leave through it.",
        messages=[{"role": "user", "content": f"The door is on the {door} side."}])
    calls = [block.input for block in message.content if block.type == "tool_use" and block.name == "move"]
    valid = bool(calls) and set(calls[0]) == {"direction"} and calls[0]["direction"] in SIDES
    reward = float(valid and calls[0]["direction"] == door)
    client.post("/v1/rl/reward", body={"reward": reward, "success": valid}, cast_to=object)
