"""The env's Action and Observation: openenv-core's pydantic base classes."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class WordAction(Action):
    word: str = Field(description="the word to say")


class WordObservation(Observation):
    prompt: str = Field(default="", description="what to do")
    attempts_left: int = Field(default=0, description="tries left in this episode")
