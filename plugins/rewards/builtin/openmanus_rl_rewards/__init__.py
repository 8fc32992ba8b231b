"""Built-in reward components for openmanus-rl (entry-point group ``openmanus_rl.rewards``).

Select them in a reward config (``configs/reward/<option>.yaml``)::

    components:
      goal:   {name: goal, weight: 1.0}
      format: {name: format, weight: 0.1}   # a reply ends as the run's template says (its end_pattern)

See :mod:`openmanus_rl_rewards.components` for each component's formula and options.
"""

from openmanus_rl_rewards.components import (
    FormatReward,
    GoalReward,
    InvalidActionPenalty,
    LengthPenalty,
    ProcessReward,
)

__all__ = ["GoalReward", "LengthPenalty", "FormatReward", "InvalidActionPenalty", "ProcessReward"]
