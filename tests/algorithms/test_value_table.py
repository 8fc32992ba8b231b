"""A table of state values over the run (``value_table``): TD(lambda) advantages over an episode's turns against
the running mean return of each (role, observation), the values from earlier steps only."""

from __future__ import annotations

import pytest
import torch

from openmanus_rl_core.algorithms.value_table import ValueTable
from openmanus_rl_core.batch import Batch
from openmanus_rl_core.plugin.registry import registry

from .turns import turn_batch as _batch


CFG = {"gamma": 1.0, "lam": 1.0, "value_window": 64}


def _turns(adv, row, turns, turn_tokens=2):
    """The advantage on each turn's first token of ``row``."""
    return [float(adv[row, k * (turn_tokens + 1)]) for k in range(turns)]


def test_the_first_step_has_no_baseline_and_later_steps_use_the_running_means():
    table = registry("advantage").get("value_table")()
    assert isinstance(table, ValueTable)
    # Step 1: two games of one seat from "J"; the table is empty, so each advantage is the turn's return.
    first = _batch([[0.0, -1.0], [0.0, -3.0]], [["J", "J bet"], ["J", "J raise"]], ["s0", "s0"])
    adv, returns = table(first, **CFG)
    assert _turns(adv, 0, 2) == pytest.approx([-1, -1]) and _turns(adv, 1, 2) == pytest.approx([-3, -3])
    assert torch.equal(adv, returns)
    assert adv[0, 2] == 0 and adv[0, 5] == 0  # observation tokens
    # The table now holds each state's mean return, and each turn index's.
    assert table.states[("s0", "J")] == [pytest.approx(-2.0), 2]
    assert table.states[("s0", "J bet")] == [pytest.approx(-1.0), 1]
    assert table.turns[("s0", 1)] == [pytest.approx(-2.0), 2]
    # Step 2: "J" has V -2; "J bet" has V -1; "J call" was never seen: the role's turn-1 value, -2.
    second = _batch([[0.0, 2.0], [0.0, 1.0]], [["J", "J bet"], ["J", "J call"]], ["s0", "s0"])
    adv = table(second, **CFG)[0]
    # lam = 1: the return against V(s_k)
    assert _turns(adv, 0, 2) == pytest.approx([2 - (-2), 2 - (-1)])
    assert _turns(adv, 1, 2) == pytest.approx([1 - (-2), 1 - (-2)])
    assert table.states[("s0", "J")] == [pytest.approx((-1 - 3 + 2 + 1) / 4), 4]


def test_lambda_zero_credits_each_turn_with_the_change_in_value_it_made():
    table = ValueTable()
    table.load_state_dict({"states": [["s0", "a", 1.0, 5], ["s0", "b", 0.5, 5], ["s0", "c", -2.0, 5]],
                           "turns": []})
    # Turn 0 on "a" (V 1), turn 1 on "b" (V 0.5), turn 2 on "c" (V -2), final reward 3.
    batch = _batch([[0.0, 0.0, 3.0]], [["a", "b", "c"]], ["s0"])
    adv = table(batch, **{**CFG, "lam": 0.0, "gamma": 0.5})[0]
    # delta_k = r_k + gamma V(s_{k+1}) - V(s_k): 0.5*0.5 - 1, 0.5*(-2) - 0.5, 3 - (-2)
    assert _turns(adv, 0, 3) == pytest.approx([-0.75, -1.5, 5.0])
    adv = ValueTable()
    adv.load_state_dict(table.state_dict())
    assert adv.states == table.states and adv.turns == table.turns  # the checkpoint's round trip


def test_action_values_give_each_allowed_token_the_mean_return_of_the_replies_that_took_it():
    """With ``all_action_coeff`` and a constrained batch, the table keys each choice a reply made by its role, its
    observation and the reply's tokens up to it; ``choice_values`` give each allowed token its value from earlier
    steps, the mean of the taken tokens' where it was never taken (the state's value where none was), and 0 at
    forced tokens and off the replies."""
    def batch(rewards):
        b = _batch([[r] for r in rewards], [["J"]] * len(rewards), ["s0"] * len(rewards))  # [reply, reply, obs]
        b["responses"] = torch.tensor([[5, 8, 0], [6, 8, 0], [5, 9, 0]])[:len(rewards)]
        # position 0: tokens 5, 6 or 7; position 1: 8 or 9 after 5, forced 8 after 6; position 2: an observation
        allowed = {5: [[5, 6, 7], [8, 9, -1]], 6: [[5, 6, 7], [8, -1, -1]]}
        b["choice_ids"] = torch.tensor([allowed[int(r[0])] + [[-1, -1, -1]] for r in b["responses"]])
        return b

    cfg = {**CFG, "all_action_coeff": 1.0}
    table = ValueTable()
    first = batch([1.0, -1.0, 3.0])
    table(first, **cfg)
    assert torch.equal(first["choice_values"], torch.zeros(3, 3, 3))  # an empty table: every state's value is 0
    assert table.actions[("s0", "J", (5,))] == [pytest.approx(2.0), 2]  # replies 0 and 2 took token 5
    assert table.actions[("s0", "J", (6,))] == [pytest.approx(-1.0), 1]
    assert table.actions[("s0", "J", (5, 8))] == [pytest.approx(1.0), 1]
    assert table.actions[("s0", "J", (5, 9))] == [pytest.approx(3.0), 1]
    assert ("s0", "J", (6, 8)) not in table.actions  # forced: no choice there
    second = batch([0.0, 0.0])
    table(second, **cfg)
    v = 0.5  # token 7 was never taken: the mean of the values of 5 and 6 (2 and -1)
    assert second["choice_values"][0].tolist() == [[2.0, -1.0, v], [1.0, 3.0, 0.0], [0.0, 0.0, 0.0]]
    assert second["choice_values"][1].tolist() == [[2.0, -1.0, v], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    third = batch([0.0])
    third["anchor_obs"] = [["Q"]]
    table.load_state_dict({**table.state_dict(), "states": [["s0", "Q", -4.0, 3]]})
    table(third, **cfg)  # a state no choice was made at yet: every token reads the state's value
    assert third["choice_values"][0, 0].tolist() == [-4.0, -4.0, -4.0]
    restored = ValueTable()
    restored.load_state_dict(table.state_dict())
    assert restored.actions == table.actions
    plain = batch([1.0])
    ValueTable()(plain, **CFG)  # the coefficient unset: no action values
    assert "choice_values" not in plain


def test_roles_windows_invalid_samples_and_turn_samples():
    table = ValueTable()
    # The two seats at the same observation text are two states; the window of 2 weighs the latest returns.
    for ret in (4.0, 0.0, 2.0):
        table(_batch([[ret], [-ret]], [["x"], ["x"]], ["s0", "s1"]), **{**CFG, "value_window": 2})
    # visits 1, 2, 3: V = 4, then 4 + (0 - 4)/2 = 2, then 2 + (2 - 2)/2 = 2
    assert table.states[("s0", "x")] == [pytest.approx(2.0), 3]
    assert table.states[("s1", "x")] == [pytest.approx(-2.0), 3]
    # An invalid sample gets 0 and leaves the table alone.
    two = _batch([[5.0], [5.0]], [["x"], ["x"]], ["s0", "s0"])
    two["valid"] = torch.tensor([True, False])
    adv = table(two, **CFG)[0]
    assert _turns(adv, 0, 1) == pytest.approx([3.0]) and _turns(adv, 1, 1) == [0.0]
    assert table.states[("s0", "x")][1] == 4
    # Turn samples (one row a turn, rows of an episode share its id): each episode's turns counted once.
    rows = _batch([[1.0, 1.0], [1.0, 1.0]], [["y", "z"], ["y", "z"]], ["s0", "s0"], episode_ids=["e", "e"])
    step_ids = rows["step_ids"].clone()
    step_ids[0, 3:] = -1  # row 0 trains turn 0, row 1 turn 1
    step_ids[1, :3] = -1
    rows = Batch(tensors={"response_mask": (step_ids >= 0).float(), "step_ids": step_ids},
                 non_tensors={k: rows[k] for k in ("step_rewards", "anchor_obs", "roles", "episode_ids")})
    adv = table(rows, **CFG)[0]
    # "y" unseen: the role's turn-0 value (x's four visits: 2 + (5 - 2) / 4 = 2.75); "z" unseen, and no turn 1: 0
    assert adv[0, 0] == pytest.approx(2.0 - 2.75) and adv[1, 3] == pytest.approx(1.0)
    assert adv[0, 3] == 0 and adv[1, 0] == 0
    assert table.states[("s0", "y")] == [pytest.approx(2.0), 1]


def test_bad_settings_are_refused():
    batch = _batch([[1.0]], [["x"]], ["s0"])
    with pytest.raises(ValueError, match="value_window must be at least 1, got 0"):
        ValueTable()(batch, **{**CFG, "value_window": 0})
    with pytest.raises(ValueError, match="lam"):
        ValueTable()(batch, **{**CFG, "lam": 1.5})
