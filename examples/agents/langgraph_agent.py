"""LangGraph with LangChain's ChatOpenAI, as their docs write it: a ``StateGraph`` whose node asks the model for a
structured output (``with_structured_output``: a strict JSON schema sent as ``response_format``).

    openmanus-rl train env=key_door agent.command="python examples/agents/langgraph_agent.py"

``ChatOpenAI`` reads OPENAI_BASE_URL and OPENAI_API_KEY; the model is OMRL_MODEL. The task row (OMRL_TASK) picks
the door's side; the episode posts reward 1 for walking through it, and success when LangChain parsed the reply
into a valid ``Move``.
"""
import json
import os
from typing import Literal, Optional, TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from openai import LengthFinishReasonError, OpenAI
from pydantic import BaseModel, ValidationError

SIDES = ("north", "east", "south", "west")


class Move(BaseModel):
    """The side of the room to leave by."""

    direction: Literal["north", "east", "south", "west"]


class State(TypedDict):
    observation: str
    move: Optional[Move]


llm = ChatOpenAI(model=os.environ["OMRL_MODEL"])


def decide(state: State) -> dict:
    try:
        move = llm.with_structured_output(Move).invoke(
            [("system", "You are in a room with one door. Leave through it."), ("user", state["observation"])])
    except (LengthFinishReasonError, ValidationError):  # a reply cut at the length cap, or one that is not a Move
        move = None
    return {"move": move}


graph = StateGraph(State).add_node("decide", decide).add_edge(START, "decide").add_edge("decide", END).compile()

if __name__ == "__main__":
    task = json.loads(os.environ["OMRL_TASK"])
    door = SIDES[task["seed"] % len(SIDES)]
    move = graph.invoke({"observation": f"The door is on the {door} side.", "move": None})["move"]
    reward = float(move is not None and move.direction == door)
    OpenAI().post("/rl/reward", body={"reward": reward, "success": move is not None}, cast_to=object)
