"""The Words environment: ``reset(seed)`` picks a word by the seed; saying it earns the rubric's 1.0 and ends the
episode; a wrong word earns 0.0 and costs one of three attempts."""

import random
import uuid

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State
from openenv.core.rubrics.base import Rubric

from omrl_words_env.models import WordAction, WordObservation

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "green"]
ATTEMPTS = 3


class SaidTheWord(Rubric):
    """1.0 when the action's word is the episode's word, else 0.0."""

    def __init__(self):
        super().__init__()
        self.target = ""

    def forward(self, action, observation) -> float:
        return 1.0 if action.word.strip().lower() == self.target else 0.0


class WordsEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__(rubric=SaidTheWord())
        self._state = State(episode_id=None, step_count=0)
        self.left = 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> WordObservation:
        self._reset_rubric()
        self.rubric.target = random.Random(seed).choice(WORDS)
        self.left = ATTEMPTS
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return WordObservation(prompt=f"Say the word: {self.rubric.target}", attempts_left=self.left)

    def step(self, action: WordAction, timeout_s=None, **kwargs) -> WordObservation:
        self._state.step_count += 1
        self.left -= 1
        obs = WordObservation(prompt="", attempts_left=self.left)
        obs.reward = self._apply_rubric(action, obs)
        obs.done = obs.reward == 1.0 or self.left <= 0
        obs.prompt = "Right." if obs.reward == 1.0 else f"Wrong. Say the word: {self.rubric.target}"
        return obs

    @property
    def state(self) -> State:
        return self._state
