"""Replies decoded as one of the env's legal actions (``rollout.constrain_actions=true``): action masking for text.

An env that knows its legal actions says so with the optional method ``action_choices() -> list[str] | None``
(:class:`~openmanus_rl_core.protocols.Env`): the texts ``step`` accepts now, or None when it does not know (then
the reply is free). The rollout asks after every ``reset`` and every ``step`` that did not end the episode, and the
episode's next reply is decoded under :func:`choice_constraint`: exactly one of ``template.render(choice)``, so
the react template's ``<action>x(1,1)</action>`` and nothing else. The engines draw each token from the model's
distribution masked to the tokens that keep the reply on one of those texts (``engines/constrained.py``); where
only one text remains, its tokens are forced (log-probability 0).

What this changes in training: every reply is a legal action, so no episode is spent on an invalid one and the
policy's choice is among the legal actions only, as OpenSpiel's bots and the exploitability adapter see it. The
policy that acts is the model's distribution renormalised over the tokens the grammar allows at each position, and
that is the policy trained (action masking):

- after each reply the rollout replays its grammar (:func:`allowed_at`) and records, per token, the tokens it
  allowed (``Episode.choices``; the batch's ``choice_ids``). The actor's log-probs, entropy and KL there are those
  of the distribution over them (``workers/logprobs.py``), so the old log-probs equal the engine's
  (``actor/rollout_logprob_diff`` near 0), the gradient moves mass among the legal choices only, and the entropy
  bonus counts the choices, not the whole vocabulary;
- the tokens the grammar allowed alone (the wrapper, the rest of a choice once its first tokens tell it apart)
  are no decision (log-probability 0): the episode lists them (``Episode.forced``) and the update leaves them out
  of its token means (``run/worker_inputs.actor_batch``); ``rollout/forced_tokens`` is their share.

A reply carries no thought: a template's ``render(choice)`` without one is the whole reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openmanus_rl_core.protocols import Constraint

__all__ = ["env_choices", "choice_constraint", "allowed_at"]


def env_choices(env: Any) -> list[str] | None:
    """``env.action_choices()``: the legal actions' texts, or None (no such method, or the env does not know).
    An answer that is not a list of strings raises TypeError naming it."""
    method = getattr(env, "action_choices", None)
    if method is None:
        return None
    choices = method()
    if choices is None:
        return None
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not all(
            isinstance(c, str) for c in choices):
        raise TypeError(f"env.action_choices() returned {choices!r:.200}, not a list of strings or None")
    return list(choices)


def choice_constraint(template: Any, choices: Sequence[str] | None) -> Constraint | None:
    """The constraint of a reply that is ``template.render(c)`` for one ``c`` of ``choices`` (None: no choices,
    a free reply; an empty list too: the env has nothing to offer, and its own answer to a reply says so)."""
    if not choices:
        return None
    from openmanus_rl_core.engines.constrained import one_of  # imports torch: not on the config's path (rollout/)

    return one_of([template.render(c) for c in choices], name="action_choices")


def allowed_at(loop: Any, constraint: Any, ids: Sequence[int]) -> list[list[int]]:
    """The tokens ``constraint`` allowed before each of a reply's ``ids``, replayed through the grammar on the
    loop's tokenizer with its engine's EOS tokens (the same masks whichever engine decoded the reply)."""
    from openmanus_rl_core.engines.constrained import Grammars, allowed_tokens

    if loop.grammars is None:
        loop.grammars = Grammars(loop.tokenizer, loop.engine.eos_token_ids)
    return allowed_tokens(loop.grammars, constraint, ids, len(loop.tokenizer))
