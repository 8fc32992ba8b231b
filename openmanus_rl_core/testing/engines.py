"""A rollout engine whose replies are given: a plugin's tests drive the real rollout loop without a model."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from openmanus_rl_core.protocols import Generation


class ScriptedEngine:
    """Replies from a script, tokenized with ``tokenizer``.

    ``replies``: a list per ``generate`` call (the i-th prompt of the k-th call gets ``replies[k][i]``), or a function
    of the prompt's decoded text. Every prompt it saw is kept, decoded, in ``prompts`` (one list per call); each
    generated token gets the log-prob ``logprob``::

        engine = ScriptedEngine(tokenizer, lambda prompt: "<action>open box</action>")
        episodes = AgentLoop(engine, tokenizer, template, make_env, RolloutConfig(max_turns=4)).run(tasks)
    """

    def __init__(self, tokenizer: Any, replies: Sequence[Sequence[str]] | Callable[[str], str],
                 logprob: float = -0.1):
        self.tok, self.replies, self.logprob = tokenizer, replies, float(logprob)
        self.calls = 0
        self.prompts: list[list[str]] = []

    def generate(self, prompts: Sequence[Sequence[int]], params: Any) -> list[Generation]:
        seen = [self.tok.decode(p) for p in prompts]
        self.prompts.append(seen)
        if callable(self.replies):
            texts = [self.replies(p) for p in seen]
        else:
            texts = list(self.replies[self.calls])
            if len(texts) != len(prompts):
                raise AssertionError(f"generate call {self.calls} got {len(prompts)} prompts; the script has "
                                     f"{len(texts)} replies for it")
        self.calls += 1
        out = []
        for text in texts:
            ids = list(self.tok.encode(text, add_special_tokens=False))
            out.append(Generation(ids, [self.logprob] * len(ids), text, "stop"))
        return out

    def update_weights(self, state_dict: Any) -> None:
        """Nothing: its replies do not depend on weights."""
