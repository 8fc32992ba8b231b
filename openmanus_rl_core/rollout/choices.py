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
tokens the grammar allowed alone (the wrapper, the rest of a choice once its first tokens tell it apart) are no
decision: the episode lists them (``Episode.forced``) and the actor's update leaves them out of the policy loss,
the entropy bonus and the KL (``run/worker_inputs.actor_batch``), so those average over the sampled tokens alone
(``rollout/forced_tokens`` is their share). The
recorded log-probabilities are the masked distribution's, and the actor's are the unmasked ones
(``engines/hf.py``): where the PPO ratio's old log-probs are the actor's own (the default), nothing differs; where
they are the rollout's (``algorithm.recompute_old_log_probs=rollout``, or ``rollout_correction=behaviour`` in the
group stream), a constrained token's ratio also carries the allowed tokens' mass. A reply carries no thought: a
template's ``render(choice)`` without one is the whole reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openmanus_rl_core.protocols import Constraint

__all__ = ["env_choices", "choice_constraint"]


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
