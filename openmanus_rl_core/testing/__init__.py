"""Conformance kit: checks a plugin author runs on an env, template, reward component, allocator or memory.

Each ``check_*`` raises :class:`ConformanceError` (an ``AssertionError``) saying what the component did
wrong, with the offending input. Call them from your plugin's tests::

    from openmanus_rl_core.testing import check_env, check_template

    def test_my_env_conforms():
        check_env(lambda: MyEnv(), task_ids=[0, 1])

Each check takes the component or its class (built with no arguments; a class that needs some is refused by name,
so pass an instance); ``check_env`` and ``check_oracle`` also take a factory.

The kit feeds hostile text (empty, huge, unicode, control characters, markup) drawn from a seeded
generator, so a failure reproduces.

The checks live by the kind they check: ``envs`` (``check_env``, ``check_oracle``, ``oracle_rollout``),
``templates``, ``rewards``, ``allocators``, ``memories``; ``engines`` holds :class:`ScriptedEngine` (replies from a
script, to drive the real rollout loop without a model); ``common`` holds :class:`ConformanceError`,
:func:`hostile_texts` and ``SMALL_RUN``. Import them from here.
"""

from .allocators import check_allocator
from .common import SMALL_RUN, ConformanceError, hostile_texts
from .engines import ScriptedEngine
from .envs import check_env, check_oracle, oracle_rollout
from .memories import check_memory
from .rewards import check_reward, sample_trajectories
from .templates import check_template

__all__ = [
    "ConformanceError",
    "ScriptedEngine",
    "hostile_texts",
    "check_env",
    "check_oracle",
    "oracle_rollout",
    "check_template",
    "check_reward",
    "check_allocator",
    "check_memory",
    "sample_trajectories",
    "SMALL_RUN",
]
