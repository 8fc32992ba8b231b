"""A table of state values kept over the run: a critic without a network, for envs whose observations repeat (a
game's information states, a grid world's cells).

Per-turn advantages need a value for each state a turn acted on. A value model learns one from text, and on a
small budget it learns little more than the mean; a batch's own turns at the same state (``state_baseline``) are
too few where states repeat across steps more than within one. This table keeps, for each role and observation,
the running mean of the returns that followed it over the steps so far, and takes TD(lambda) advantages over the
episode's turns against it:

    V(s)    = the table's value of the turn's (role, observation); where that state was never seen, the role's value
              at the same turn index; where that too was never seen, 0
    delta_k = r_k + gamma * V(s_{k+1}) - V(s_k)                 (V = 0 after the last turn, as after a game's end;
                                                                  an episode cut at max_turns is read as ended)
    A_k     = sum_{k' >= k} (gamma * lam)^(k' - k) delta_{k'}    (lam = 1: the return against V(s_k))

With ``lam`` below 1, a move is credited with what changed between the state it acted on and the next state the
role saw, rather than with the whole game's result: a move that leaves a win open shows it at once. The values
come from earlier steps only (a sample's own return is never in its baseline); this step's returns then update
them, a state's mean over its last ``window`` visits (step size ``1 / min(visits, window)``: the policy moves, so
old returns fade). The table is the estimator's state and lives in the run's checkpoint.

**Action values** (``algorithm.all_action_coeff``, replies decoded under ``rollout.constrain_actions``). At each
position of a reply where the constraint allowed more than one token, the table also keeps, for each token taken
there, the mean return of the replies that took it: keyed by the role, the observation and the reply's tokens up to
and including that one, so a token's value is that of the action it begins or spells, averaged over how the policy
went on. The batch's ``choice_values`` ``[B, R, K]`` (laid out as ``choice_ids``) give each allowed token its value
from earlier steps; a token never taken there reads the mean of those that were (the state's value where none was),
so that, with no evidence either way, it is neither pushed nor held back. The actor's all-action loss
(:func:`~.losses.all_action_loss`) moves every allowed token's logit by it, not the sampled one alone: an action the
policy has stopped taking keeps the value it showed, and its logit goes up while that value beats the other allowed
tokens', however unlikely the action has become.
"""

from __future__ import annotations

from typing import Any

import torch

from .discounting import _reverse_discounted_cumsum
from .grouping import _bool, _check_discount, _float_dtype, _take, _valid_rows, episode_index
from .steps import _step_inputs, _turns_to_tokens

__all__ = ["ValueTable"]


class ValueTable:
    """Entry point ``value_table`` (module docstring). Batch: tensors ``response_mask``, ``step_ids``; non_tensors
    ``anchor_obs``, ``step_rewards``, ``roles``. cfg: ``gamma``, ``lam``, ``value_window`` (algorithm.*). One
    instance per run: call it like an estimator function; ``state_dict`` / ``load_state_dict`` carry the table
    through a checkpoint."""

    reads_turn_rewards = True  # its returns are the turns' rewards (the KL reward penalty is on tokens)
    values_choices = True  # with algorithm.all_action_coeff it writes the batch's choice_values (config rule)

    def __init__(self) -> None:
        self.states: dict[tuple[str, str], list[float]] = {}  # (role, observation) -> [mean return, visits]
        self.turns: dict[tuple[str, int], list[float]] = {}  # (role, turn index) -> [mean return, visits]
        # (role, observation, the reply's tokens up to a choice's) -> [mean return, visits]
        self.actions: dict[tuple[str, str, tuple[int, ...]], list[float]] = {}

    def __call__(self, batch: Any, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, advantages)``; with ``all_action_coeff`` set and a batch decoded under a constraint
        (``choice_ids``), it also writes the batch's ``choice_values``."""
        batch.require("response_mask", "step_ids", "anchor_obs", "step_rewards", "roles",
                      who="advantage estimator 'value_table'")
        choices = None
        if cfg.get("all_action_coeff") and "choice_ids" in batch:
            choices = (batch["responses"], batch["choice_ids"])
        adv, values = self.advantages(batch["response_mask"], batch["step_ids"], batch["step_rewards"],
                                      batch["anchor_obs"], batch["roles"], gamma=cfg["gamma"], lam=cfg["lam"],
                                      window=cfg["value_window"], valid=batch.get("valid"),
                                      episode_ids=batch.get("episode_ids"), choices=choices)
        if values is not None:
            batch["choice_values"] = values
        return adv, adv

    @torch.no_grad()
    def advantages(self, response_mask: torch.Tensor, step_ids: torch.Tensor, step_rewards: Any, anchor_obs: Any,
                   roles: Any, gamma: float, lam: float, window: int, valid: Any = None,
                   episode_ids: Any = None, choices: tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``([B, T] advantages, choice values or None)`` of a batch against the table, then the table updated with
        the batch's returns. Inputs as in :func:`~.steps.compute_state_baseline`; samples not ``valid`` get 0 and
        leave the table as it was. ``choices``: the batch's ``(responses [B, R], choice_ids [B, R, K])``; then the
        second value is ``choice_values`` ``[B, R, K]`` (module docstring), 0 where ``choice_ids`` is -1."""
        if int(window) < 1:
            raise ValueError(f"value_window must be at least 1, got {window!r}")
        gamma, lam = _check_discount("gamma", gamma), _check_discount("lam", lam)
        m = _bool(response_mask)
        device = response_mask.device
        B = m.shape[0]
        labels = ["" if r is None else str(r) for r in roles]
        sample_valid = _valid_rows(valid, B, device)
        row_episode = None
        if episode_ids is not None:  # turn samples: each episode's turns counted once
            row_episode, _, first = episode_index(episode_ids, B, device)
            step_rewards, anchor_obs, labels = _take(step_rewards, first), _take(anchor_obs, first), _take(labels, first)
            sample_valid = None if sample_valid is None else sample_valid[first]
        observations = [list(row) for row in anchor_obs]
        _, rewards, steps = _step_inputs(observations, step_rewards, len(labels), device)
        E, S = steps.shape
        counted = steps if sample_valid is None else steps & sample_valid.unsqueeze(1)
        values = torch.tensor([[self._value(labels[e], k, obs[k]) if k < len(obs) else 0.0 for k in range(S)]
                               for e, obs in enumerate(observations)], dtype=torch.float64).reshape(E, S).to(device)
        following = torch.nn.functional.pad(values[:, 1:], (0, 1))  # V(s_{k+1}); 0 after the last turn
        zero = torch.zeros((), dtype=torch.float64, device=device)
        delta = torch.where(steps, rewards + gamma * following - values, zero)
        adv = torch.where(counted, _reverse_discounted_cumsum(delta, gamma * lam), zero)
        returns = _reverse_discounted_cumsum(rewards, gamma)
        choice_values = None
        if choices is not None:
            choice_values = self._choice_values(choices, step_ids, m, labels, observations, values, returns, counted,
                                                row_episode, int(window))
        for e, k in counted.nonzero().tolist():
            self._visit(self.states, (labels[e], str(observations[e][k])), float(returns[e, k]), int(window))
            self._visit(self.turns, (labels[e], k), float(returns[e, k]), int(window))
        num_steps = steps.sum(-1)
        if row_episode is not None:
            adv, num_steps = adv[row_episode], num_steps[row_episode]
        token_adv = _turns_to_tokens(adv, num_steps, step_ids)
        return torch.where(m, token_adv, zero).to(_float_dtype(response_mask)), choice_values

    def _choice_values(self, choices: tuple[torch.Tensor, torch.Tensor], step_ids: torch.Tensor, mask: torch.Tensor,
                       labels: list[str], observations: list[list], values: torch.Tensor, returns: torch.Tensor,
                       counted: torch.Tensor, row_episode: torch.Tensor | None, window: int) -> torch.Tensor:
        """The batch's ``choice_values`` from the action table as earlier steps left it, then the table updated
        with this batch's returns (each choice a reply made, keyed by its tokens up to it)."""
        responses, choice_ids = choices
        turn_of, ids, allowed = step_ids.long().cpu(), responses.long().cpu(), choice_ids.long().cpu()
        out = torch.zeros(allowed.shape, dtype=torch.float32)
        chosen = (allowed[..., 1] >= 0) & mask.cpu() & (turn_of >= 0)  # two tokens or more were allowed
        visits = []
        for b, t in chosen.nonzero().tolist():
            e = b if row_episode is None else int(row_episode[b])
            k = int(turn_of[b, t])
            if not bool(counted[e, k]):
                continue
            start = t
            while start > 0 and int(turn_of[b, start - 1]) == k:
                start -= 1
            state = (labels[e], str(observations[e][k]))
            prefix = tuple(ids[b, start:t].tolist())
            tokens = [token for token in allowed[b, t].tolist() if token >= 0]  # ids first, then -1 padding
            found = [self.actions.get((*state, prefix + (token,))) for token in tokens]
            known = [entry[0] for entry in found if entry]
            unknown = sum(known) / len(known) if known else float(values[e, k])
            out[b, t, :len(tokens)] = torch.tensor([entry[0] if entry else unknown for entry in found])
            visits.append(((*state, prefix + (int(ids[b, t]),)), float(returns[e, k])))
        for key, ret in visits:
            self._visit(self.actions, key, ret, window)
        return out.to(choice_ids.device)

    def _value(self, role: str, turn: int, observation: Any) -> float:
        found = self.states.get((role, str(observation))) or self.turns.get((role, turn))
        return found[0] if found else 0.0

    @staticmethod
    def _visit(table: dict, key: tuple, ret: float, window: int) -> None:
        entry = table.setdefault(key, [0.0, 0])
        entry[1] += 1
        entry[0] += (ret - entry[0]) / min(entry[1], window)

    def state_dict(self) -> dict[str, list]:
        """The table as lists (``[role, observation or turn index, mean, visits]`` rows; action values ``[role,
        observation, tokens, mean, visits]``), for a checkpoint."""
        return {"states": [[r, o, v, n] for (r, o), (v, n) in self.states.items()],
                "turns": [[r, k, v, n] for (r, k), (v, n) in self.turns.items()],
                "actions": [[r, o, list(p), v, n] for (r, o, p), (v, n) in self.actions.items()]}

    def load_state_dict(self, state: dict[str, list]) -> None:
        self.states = {(str(r), str(o)): [float(v), int(n)] for r, o, v, n in state["states"]}
        self.turns = {(str(r), int(k)): [float(v), int(n)] for r, k, v, n in state["turns"]}
        self.actions = {(str(r), str(o), tuple(int(t) for t in p)): [float(v), int(n)]
                        for r, o, p, v, n in state.get("actions", [])}  # a checkpoint from before action values
