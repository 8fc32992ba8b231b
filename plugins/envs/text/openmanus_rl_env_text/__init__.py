"""In-process text environments for openmanus-rl: nothing to install, learnable by a tiny model on a CPU.

Every env here answers exactly one well-formed action per step and gives no partial credit, so a policy
cannot earn reward by spamming candidates: extra words make an action wrong (or invalid), never half right.

=============  ==========  ==========================================================================
entry point    turns       task
=============  ==========  ==========================================================================
word_copy      1           repeat the word the observation names
key_door       2 (max 4)   ``open box`` shows a password; ``say <password>`` opens the door
guess_number   <= 5        find a number in 1..16 from higher/lower feedback
=============  ==========  ==========================================================================
"""

from openmanus_rl_env_text.base import VOCAB, TextEnv, normalize
from openmanus_rl_env_text.guess_number import GuessNumberEnv
from openmanus_rl_env_text.key_door import KeyDoorEnv
from openmanus_rl_env_text.word_copy import WordCopyEnv

__all__ = ["VOCAB", "TextEnv", "normalize", "WordCopyEnv", "KeyDoorEnv", "GuessNumberEnv"]
