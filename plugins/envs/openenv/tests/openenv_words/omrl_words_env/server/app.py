"""The Words app: openenv-core's create_app. WORDS_SESSIONS sets how many WebSocket sessions it holds at once."""

import os

from openenv.core.env_server.http_server import create_app

from omrl_words_env.models import WordAction, WordObservation
from omrl_words_env.server.environment import WordsEnvironment

app = create_app(WordsEnvironment, WordAction, WordObservation, env_name="omrl_words_env",
                 max_concurrent_envs=int(os.environ.get("WORDS_SESSIONS", "8")))
