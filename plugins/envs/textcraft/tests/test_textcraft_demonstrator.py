"""The systematic demonstrator of TextCraft's one-craft goals (``warmup.demonstrator=one_of_each``): its error rate
over 1000 tasks and the error it makes."""

from __future__ import annotations

from openmanus_rl_core.run.warmup import demonstrator_policy, play_episode
from openmanus_rl_env_textcraft import TextCraftEnv

TURNS = 6  # the textcraft_depth1 preset's env.max_turns


def test_one_of_each_fails_on_two_thirds_of_the_one_craft_goals_by_ignoring_counts():
    env = TextCraftEnv(max_depth=1)
    ours, oracle, refused_crafts = [], [], 0
    for i in range(1000):  # every one-craft goal, 8 seeds each (the seed picks distractors and their order)
        task = {"task_id": i % env.num_tasks, "seed": i // env.num_tasks}
        _, steps, reward, success = play_episode(env, task, TURNS, demonstrator_policy(env, "one_of_each"))
        ours.append(success)
        assert reward == float(success)
        assert all(a.startswith(("get 1 ", "craft ", "inventory")) for a, _ in steps)  # never more than one
        if not success:
            refused_crafts += any(a.startswith("craft ") and o.startswith("Could not find enough")
                                  for a, o in steps)
        oracle.append(play_episode(env, task, TURNS, demonstrator_policy(env, "oracle"))[3])
    assert sum(ours) == 336  # error rate 0.664 over the 1000 tasks
    assert sum(oracle) == 992
    assert refused_crafts >= 0.9 * (1000 - sum(ours))  # its failures craft before holding enough
