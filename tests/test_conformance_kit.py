"""The conformance kit fails on components that break the contract (so a pass means something)."""

import pytest

from openmanus_rl_core.protocols import ParsedAction, StepResult
from openmanus_rl_core.testing import (
    ConformanceError,
    check_allocator,
    check_env,
    check_oracle,
    check_reward,
    check_memory,
    check_template,
    hostile_texts,
)


class GoodEnv:
    instruction = "Say yes."

    def reset(self, task_id=None, seed=None):
        self.t = 0
        return f"task {task_id}"

    def step(self, action):
        self.t += 1
        ok = action == "yes"
        return StepResult("ok" if ok else "no", 1.0 if ok else 0.0, ok or self.t > 2, {"success": ok} if ok else {})

    def oracle_action(self):
        return "yes"

    def close(self):
        pass


class CrashesOnWeirdText(GoodEnv):
    def step(self, action):
        action.encode("ascii")  # raises on unicode
        return super().step(action)


class NonDeterministicReset(GoodEnv):
    n = 0

    def reset(self, task_id=None, seed=None):
        NonDeterministicReset.n += 1
        return f"task {NonDeterministicReset.n}"


class WrongOracle(GoodEnv):
    def oracle_action(self):
        return "no"


class GoodTemplate:
    stop = ["</a>"]

    def system_prompt(self, instruction):
        return f"Act. {instruction}"

    def parse(self, text):
        if "<a>" in text and "</a>" in text:
            inner = text.split("<a>", 1)[1].split("</a>", 1)[0]
            return ParsedAction("action", inner, True)
        return ParsedAction("invalid", text, False)

    def render(self, action, thought=""):
        return f"<a>{action}</a>"


class RaisingTemplate(GoodTemplate):
    def parse(self, text):
        return ParsedAction("action", text.split("<a>")[1], True)


def test_good_components_pass():
    check_env(GoodEnv, actions=["yes"])
    check_oracle(GoodEnv, task_ids=[0, 1, 2])
    check_template(GoodTemplate())
    check_allocator(lambda r, tr, segs, n: [r if i == segs[-1][1] - 1 else 0.0 for i in range(n)])

    class Length:
        def compute(self, t):
            return -0.01 * t.response_length

    check_reward(Length())


def test_env_that_raises_on_unicode_fails_the_kit():
    with pytest.raises(UnicodeEncodeError):
        check_env(CrashesOnWeirdText)


def test_nondeterministic_reset_fails_the_kit():
    with pytest.raises(ConformanceError, match="not deterministic"):
        check_env(NonDeterministicReset)


def test_oracle_that_never_succeeds_fails_the_kit():
    with pytest.raises(ConformanceError, match="did not succeed"):
        check_oracle(WrongOracle, task_ids=[0])


def test_template_that_raises_fails_the_kit():
    with pytest.raises(ConformanceError, match="raised IndexError"):
        check_template(RaisingTemplate())


def test_allocator_writing_outside_segments_fails_the_kit():
    with pytest.raises(ConformanceError, match="outside every agent segment"):
        check_allocator(lambda r, tr, segs, n: [r] * n)


def test_reward_with_inconsistent_turns_fails_the_kit():
    class Bad:
        def compute(self, t):
            return 1.0

        def compute_turns(self, t):
            return [0.0] * len(t.turns)

    with pytest.raises(ConformanceError, match="sums to 0"):
        check_reward(Bad())


class Length:
    def compute(self, t):
        return -0.01 * t.response_length


class LastToken:
    def __call__(self, reward, turn_rewards, segments, length):
        return [reward if i == segments[-1][1] - 1 else 0.0 for i in range(length)]


class LastTurnMemory:
    per_turn = True

    def messages(self, system, task, history):
        last = [{"role": "assistant", "content": history[-1].reply},
                {"role": "user", "content": history[-1].observation}] if history else []
        return [{"role": "system", "content": system}, {"role": "user", "content": task}, *last]


def test_every_check_takes_a_class_or_an_instance():
    check_reward(Length)
    check_reward(Length())
    check_env(GoodEnv, actions=["yes"])
    check_env(GoodEnv(), actions=["yes"])
    check_env(lambda: GoodEnv(), actions=["yes"])  # a factory still works
    check_oracle(GoodEnv, task_ids=[0, 1])
    check_oracle(GoodEnv(), task_ids=[0, 1])
    check_template(GoodTemplate)
    check_template(GoodTemplate())
    check_allocator(LastToken)
    check_allocator(LastToken())
    check_memory(LastTurnMemory)
    check_memory(LastTurnMemory())


def test_the_kit_still_judges_a_class_it_built():
    with pytest.raises(ConformanceError, match="not deterministic"):
        check_env(NonDeterministicReset())
    with pytest.raises(ConformanceError, match="raised IndexError"):
        check_template(RaisingTemplate)


def test_a_class_that_needs_arguments_is_refused_by_name():
    class Scaled:
        def __init__(self, scale):
            self.scale = scale

        def compute(self, t):
            return self.scale

    class NeedsPath(GoodEnv):
        def __init__(self, path, *, level=1):
            self.path = path

    with pytest.raises(TypeError, match=r"check_reward\(Scaled\).*'scale'.*check_reward\(Scaled\(\.\.\.\)\)"):
        check_reward(Scaled)
    with pytest.raises(TypeError, match=r"check_env\(NeedsPath\).*'path'"):
        check_env(NeedsPath)
    check_reward(Scaled(0.5))
    check_env(NeedsPath("/x"), actions=["yes"])


def test_hostile_texts_are_reproducible():
    assert hostile_texts(5, seed=3) == hostile_texts(5, seed=3)
    assert hostile_texts(5, seed=3) != hostile_texts(5, seed=4)
