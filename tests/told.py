"""An engine's ``on_tokens`` listener for the streaming tests (hf and vLLM): what it was told, in order."""

from __future__ import annotations


class Told:
    """Each prompt's tokens in the order told, and how many tokens each call told."""

    def __init__(self, prompts: int):
        self.tokens: list[list[int]] = [[] for _ in range(prompts)]
        self.steps: list[int] = []

    def __call__(self, rows: list[int], tokens: list[int]) -> None:
        self.steps.append(len(rows))
        for i, t in zip(rows, tokens):
            self.tokens[i].append(t)
