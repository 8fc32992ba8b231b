"""Per-state baselines (``state_baseline``): each turn's return against the mean return of the batch's other turns
at the same observation and role, else at the same turn index and role."""

from __future__ import annotations

import pytest
import torch

from openmanus_rl_core.algorithms import compute_state_baseline
from openmanus_rl_core.plugin.registry import registry

from .turns import turn_batch as _batch


def test_each_turn_is_compared_with_the_other_turns_at_its_state_across_tasks():
    # Four games of one seat over two deals. Turn 0 acts on "J" (two games) or "K" (two games); turn 1 of the
    # first three acts on "J bet" / "K bet". Only the last step is rewarded (the game's chips).
    step_rewards = [[0.0, -1.0], [0.0, -3.0], [0.0, 2.0], [4.0]]
    anchor_obs = [["J", "J bet"], ["J", "J bet"], ["K", "K bet"], ["K"]]
    roles = ["leduc:seat0"] * 4
    adv = registry("advantage").get("state_baseline")(_batch(step_rewards, anchor_obs, roles))[0]
    # returns: row 0 (-1, -1), row 1 (-3, -3), row 2 (2, 2), row 3 (4)
    # turn 0 at "J": rows 0 and 1, leave-one-out: -1 - (-3) = 2 and -3 - (-1) = -2
    # turn 0 at "K": rows 2 and 3: 2 - 4 = -2 and 4 - 2 = 2
    # turn 1 at "J bet": rows 0 and 1: 2 and -2; "K bet" is seen once: the other turn-1 returns of the role,
    # rows 0 and 1 (mean -2): 2 - (-2) = 4
    assert adv[0].tolist() == pytest.approx([2, 2, 0, 2, 2, 0])
    assert adv[1].tolist() == pytest.approx([-2, -2, 0, -2, -2, 0])
    assert adv[2].tolist() == pytest.approx([-2, -2, 0, 4, 4, 0])
    assert adv[3].tolist() == pytest.approx([2, 2, 0, 0, 0, 0])  # it has one turn; the rest is padding


def test_roles_keep_their_own_baselines_and_a_lone_turn_gets_zero():
    step_rewards = [[1.0], [3.0], [-1.0], [5.0]]
    anchor_obs = [["x"], ["x"], ["x"], ["y"]]
    roles = ["seat0", "seat0", "seat1", "seat2"]
    adv = compute_state_baseline(_batch(step_rewards, anchor_obs, roles)["response_mask"],
                                 _batch(step_rewards, anchor_obs, roles)["step_ids"], step_rewards, anchor_obs, roles)
    # seat0's two turns at "x": 1 - 3 and 3 - 1; seat1's "x" is another seat's state, and it is alone in its role
    assert adv[:, 0].tolist() == pytest.approx([-2, 2, 0, 0])


def test_discounted_returns_invalid_rows_and_turn_rows_of_one_episode():
    # Episode e0 is two turn rows (one a turn), e1 and e2 one row each; e2 is not valid and counts nowhere.
    step_rewards = [[1.0, 2.0], [1.0, 2.0], [0.0, 4.0], [0.0, 100.0]]
    anchor_obs = [["a", "b"], ["a", "b"], ["a", "b"], ["a", "b"]]
    step_ids = torch.tensor([[0, 0, -1], [1, 1, -1], [0, 1, -1], [0, 1, -1]])
    mask = (step_ids >= 0).float()
    valid = torch.tensor([True, True, True, False])
    adv = compute_state_baseline(mask, step_ids, step_rewards, anchor_obs, [None] * 4, gamma=0.5, valid=valid,
                                 episode_ids=["e0", "e0", "e1", "e2"])
    # returns with gamma 0.5: e0 (1 + 1, 2), e1 (2, 4); at "a": 2 - 2 = 0 both; at "b": 2 - 4 and 4 - 2
    assert adv[0].tolist() == pytest.approx([0, 0, 0])
    assert adv[1].tolist() == pytest.approx([-2, -2, 0])
    assert adv[2].tolist() == pytest.approx([0, 2, 0])
    assert adv[3].tolist() == [0, 0, 0]


def test_a_step_id_past_the_turns_is_refused():
    step_ids = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match="step_ids of sample 0 reach 1 but it has 1 anchor observations"):
        compute_state_baseline(torch.ones(1, 2), step_ids, [[1.0]], [["a"]], ["r"])
