"""env=python: a plain class's public methods as tools (their schemas as transformers' get_json_schema writes them),
calls checked and run, get_reward as the reward, task kwargs, one instance per episode, bad classes refused in one
line before anything starts; the tools reaching the model through the real Qwen2.5 chat template in the rollout
loop; and docs/ecosystem-envs.md's class trained from Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
from transformers.utils import get_json_schema

from openmanus_rl_core.api import env_class_overrides
from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.plugin.registry import build, registry
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, expand_tasks
from openmanus_rl_core.testing import SMALL_RUN, ScriptedEngine, check_env, oracle_rollout
from openmanus_rl_env_python import PythonEnv, function_schema
from openmanus_rl_templates.tool_calls import canonical

import readme_thermostat
from readme_thermostat import Thermostat

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
QWEN25 = (HERE.parents[2] / "templates" / "builtin" / "tests" / "chat_templates" / "qwen2_5_instruct.jinja").read_text()
THERMO = "readme_thermostat:Thermostat"


def call(name: str, **args: Any) -> str:
    return canonical(name, args)


# ---------------------------------------------------------------------------------- classes of these tests
class Shop:
    """Buy what the list asks for."""

    tasks = [{"item": "apple", "budget": 3}, {"item": "pear", "budget": 5}]

    def reset(self, item: str, budget: int) -> str:
        self.item, self.budget, self.bought, self.done, self.closed = item, budget, [], False, 0
        return f"Buy one {item} with at most {budget} coins."

    def buy(self, item: Literal["apple", "pear", "plum"], count: int = 1, note: Optional[str] = None) -> dict:
        """Buy an item.

        Args:
            item: what to buy
            count: how many
            note: a note for the shop,
                written on the receipt
        Returns:
            the receipt
        """
        self.bought += [item] * count
        return {"bought": item, "count": count, "note": note}

    def pay(self, coins: list[int], tip: dict[str, float]) -> str:
        """Pay with coins.

        Args:
            coins: the coins' values
            tip: tips by name
        """
        self.done = True
        self.success = self.bought == [self.item] and sum(coins) <= self.budget
        return "Paid."

    @staticmethod
    def price(item: str) -> int:
        """The price of an item.

        Args:
            item: the item
        """
        return {"apple": 2, "pear": 4}.get(item, 9)

    def fail(self):
        raise RuntimeError("the shop is closed")

    def _secret(self) -> None:
        raise AssertionError("a private method is no tool")

    @property
    def total(self) -> int:
        return len(self.bought)

    def get_reward(self) -> float:
        return float(len(self.bought)) - (2.0 if getattr(self, "success", None) is False else 0.0)

    def close(self) -> None:
        self.closed += 1
        CLOSED.append(self)


CLOSED: list = []


class Loose:
    def reset(self, **task):
        self.task = task

    def poke(self, thing, times: int = 2):
        return None


class NoReset:
    def heat(self, degrees: int) -> str:
        return "warm"


class NoTools:
    def reset(self) -> str:
        return "hi"


class OddHint:
    def reset(self) -> str:
        return "hi"

    def use(self, tool: Shop) -> str:
        return "x"


# -------------------------------------------------------------------------------------------- the schemas
def test_each_public_method_is_a_tool_with_the_schema_transformers_writes_for_it():
    env = PythonEnv(cls=f"{__name__}:Shop")
    names = [t["function"]["name"] for t in env.tools]
    assert names == ["buy", "pay", "price", "fail"]  # definition order; reset, get_reward, close, _secret, total: not
    by_name = {t["function"]["name"]: t for t in env.tools}
    for name in ("buy", "pay", "price"):
        assert by_name[name] == get_json_schema(getattr(Shop, name)), name
    assert by_name["buy"]["function"]["parameters"] == {
        "type": "object", "required": ["item"], "properties": {
            "item": {"type": "string", "enum": ["apple", "pear", "plum"], "description": "what to buy"},
            "count": {"type": "integer", "description": "how many"},
            "note": {"type": "string", "nullable": True, "description": "a note for the shop, written on the receipt"}}}
    assert by_name["buy"]["function"]["return"] == {"type": "object", "description": "the receipt"}
    assert by_name["fail"] == {"type": "function", "function": {"name": "fail", "description": "", "parameters": {
        "type": "object", "properties": {}}}}
    assert env.instruction == "Buy what the list asks for." and env.num_tasks == 2
    env.tools[0]["function"]["name"] = "changed"  # the env's list is its own copy
    assert PythonEnv(cls=f"{__name__}:Shop").tools[0]["function"]["name"] == "buy"


def test_a_method_without_hints_or_docs_still_is_a_tool():
    schema = function_schema("poke", Loose.poke)
    assert schema["function"]["parameters"] == {"type": "object", "properties": {"thing": {}, "times": {
        "type": "integer"}}, "required": ["thing"]}
    assert PythonEnv(cls=f"{__name__}:Loose").instruction == ""


# -------------------------------------------------------------------------------------------- the calls
def test_calls_run_the_tools_and_bad_calls_are_invalid_actions_saying_why():
    env = PythonEnv(cls=f"{__name__}:Shop")
    assert env.reset(task_id=1) == "Buy one pear with at most 5 coins."
    res = env.step(call("buy", item="pear"))
    assert (res.observation, res.reward, res.done) == ('{"bought": "pear", "count": 1, "note": null}', 1.0, False)
    assert res.info == {"tool": "buy", "score": 1.0}
    assert env.step(call("price", item="apple")).observation == "2"  # a static method; non-str results as JSON
    bad = {
        "buy pear": "the reply is not a tool call; call one of the tools: buy(item, count, note), pay(coins, tip), "
                    "price(item), fail()",
        call("steal", item="pear"): "there is no tool 'steal'; the tools are: buy(item, count, note), pay(coins, tip), "
                                    "price(item), fail()",
        call("buy", item="kiwi"): "buy: item must be one of 'apple', 'pear', 'plum', got 'kiwi'",
        call("buy", item="pear", count="2"): "buy: count must be an integer, got '2'",
        call("buy", item="pear", count=True): "buy: count must be an integer, got True",
        call("buy", item="pear", count=1.5): "buy: count must be an integer, got 1.5",
        call("buy", count=1): "buy needs the argument 'item'",
        call("buy", item="pear", colour="red"): "buy takes no argument 'colour'; its arguments: item, count, note",
        call("pay", coins=[1, "2"], tip={}): "pay: coins[1] must be an integer, got '2'",
        call("pay", coins=[1], tip={"bob": "x"}): "pay: tip['bob'] must be a number, got 'x'",
        '{"name": "buy", "arguments": [1]}': "buy: the arguments must be an object, got [1]",
        call("fail"): "fail failed: RuntimeError: the shop is closed",
    }
    for action, why in bad.items():
        res = env.step(action)
        assert (res.observation, res.reward, res.done) == (f"Invalid tool call: {why}", 0.0, False), action
        assert res.info["invalid"] is True and res.info["error"] == why
        assert res.info.get("tool_error", False) is (action == call("fail"))
    assert env.step(call("buy", item="pear", note=None)).observation.startswith('{"bought": "pear"')
    res = env.step(call("pay", coins=[2, 3], tip={"bob": 1}))
    # get_reward went 1 -> 2 -> 0 (two pears: no success): each step's reward is the change, summing to the last value
    assert (res.observation, res.reward, res.done, res.info) == ("Paid.", -2.0, True, {"tool": "pay", "score": 0.0,
                                                                                       "success": False})
    assert env.step(call("buy", item="pear")).observation == "The episode is over."


def test_the_conformance_kit_passes():
    check_env(lambda: PythonEnv(cls=f"{__name__}:Shop"), task_ids=[0, 1],
              actions=[call("buy", item="apple"), call("pay", coins=[2], tip={})])
    check_env(lambda: PythonEnv(cls=THERMO), actions=[call("heat", degrees=2), call("finish")])


def test_one_instance_per_episode_and_close_reaches_the_class():
    CLOSED.clear()
    env = PythonEnv(cls=f"{__name__}:Shop")
    env.reset(task_id=0)
    env.step(call("buy", item="apple"))
    first = env._obj
    env.reset(task_id=0)
    assert env._obj is not first and env._obj.bought == [] and CLOSED == [first]
    env.close()
    env.close()
    assert len(CLOSED) == 2 and all(s.closed == 1 for s in CLOSED)


def test_where_task_kwargs_come_from():
    thermo = PythonEnv(cls=THERMO, tasks=[{"target": 20, "start": 16}, {"target": 22}])
    assert thermo.num_tasks == 2
    assert thermo.reset(task_id=1) == "The room is at 16 degrees; the target is 22."
    assert thermo.reset(task_id=None, seed=5) == thermo.reset(task_id=None, seed=5)
    with pytest.raises(ValueError, match=r"task_id 2 is out of range: Thermostat has 2 tasks"):
        thermo.reset(task_id=2)
    # the class's own tasks, unless env.kwargs.tasks replaces them
    assert PythonEnv(cls=f"{__name__}:Shop").reset(task_id=0) == "Buy one apple with at most 3 coins."
    assert PythonEnv(cls=f"{__name__}:Shop", tasks=[{"item": "plum", "budget": 1}]).reset(0).startswith("Buy one plum")
    # no list: task_id and seed, each where reset takes it
    assert not hasattr(PythonEnv(cls=THERMO), "num_tasks")
    assert PythonEnv(cls=THERMO).reset(task_id=7, seed=3) == "The room is at 16 degrees; the target is 21."
    loose = PythonEnv(cls=f"{__name__}:Loose")
    assert loose.reset(task_id=7, seed=3) == "" and loose._obj.task == {"task_id": 7, "seed": 3}
    built = PythonEnv(cls=THERMO, init={})
    assert built.reset() and isinstance(built._obj, readme_thermostat.Thermostat)


def test_a_task_files_own_columns_reach_reset_through_the_rollout(tmp_path, qwen_tokenizer):
    """A dataset's columns (TRL's way: one row per task, reset(**columns)) go to reset over the kwargs of the id:
    through a real parquet task file and the rollout loop; with **kwargs, every column but the core's bookkeeping."""
    from openmanus_rl_core.data.tasks import load_tasks, write_tasks

    write_tasks(tmp_path / "train.parquet", [
        {"task_id": 0, "seed": 0, "target": 18, "start": 15, "data_source": "mine"},
        {"task_id": 1, "seed": 1, "target": 25, "start": None, "note": "no start: reset's default 16"}])
    rows = load_tasks(tmp_path / "train.parquet")
    r = registry("template").get("qwen_tools")().render
    loop, engine = thermostat_loop(qwen_tokenizer, [[r(call("heat", degrees=3))] * 2, [r(call("finish"))] * 2])
    episodes = loop.run(expand_tasks(rows, 1))
    assert [e.trajectory.turns[0].observation for e in episodes] == ["The room is at 18 degrees.",
                                                                      "The room is at 19 degrees."]
    assert [p[0].rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0] for p in engine.prompts[:1]] == [
        "The room is at 15 degrees; the target is 18."]
    assert [e.trajectory.env_reward for e in episodes] == [1.0, 0.0]  # 15 + 3 == 18; 16 + 3 != 25

    # the row's columns win over env.kwargs.tasks[task_id]; a column reset does not name is not given to it
    listed = PythonEnv(cls=THERMO, tasks=[{"target": 30, "start": 10}, {"target": 31, "start": 11}])
    assert listed.start_task({**rows[0], "extra": {}}) == "The room is at 15 degrees; the target is 18."
    assert listed.start_task(rows[1]) == "The room is at 11 degrees; the target is 25."
    loose = PythonEnv(cls=f"{__name__}:Loose")
    loose.start_task({**rows[1], "split": "train", "group_id": "g0"})
    assert loose._obj.task == {"task_id": 1, "seed": 1, "target": 25, "note": "no start: reset's default 16"}


# ---------------------------------------------------------------------------- settings checked before a run
@pytest.mark.parametrize("override,line", [
    ("env.kwargs.cls=null", r"^env\.kwargs\.cls=null: required: the class whose public methods are the tools"),
    ("env.kwargs.cls=no_such_module_x:Env", r"^env\.kwargs\.cls=no_such_module_x:Env: no module named "
                                             r"'no_such_module_x'"),
    ("env.kwargs.cls=readme_thermostat:Thermo", r"^env\.kwargs\.cls=readme_thermostat:Thermo: the module "
                                                 r"readme_thermostat has no 'Thermo'"),
    ("env.kwargs.cls=readme_thermostat:omrl", r"^env\.kwargs\.cls=readme_thermostat:omrl: omrl is a module, not a "
                                               r"class"),
    (f"env.kwargs.cls={__name__}:NoReset", rf"^env\.kwargs\.cls={__name__}:NoReset: the class NoReset has no "
                                           r"reset\(\*\*task\) method"),
    (f"env.kwargs.cls={__name__}:NoTools", r"the class NoTools has no public method, so the model has no tool"),
    (f"env.kwargs.cls={__name__}:OddHint", r"the tool OddHint\.use\(tool: Shop\): the type hint cannot be written "
                                           r"as a JSON schema"),
    ("env.kwargs.tasks=[]", r"^env\.kwargs\.tasks=\[\]: give at least one task"),
    ("env.kwargs.tasks=[{targt:3}]", r"^env\.kwargs\.tasks\[0\]=\{\"targt\": 3\}: Thermostat\.reset\(\.\.\.\): got an "
                                     r"unexpected keyword argument 'targt'"),
    ("env.kwargs.tasks=[3]", r"^env\.kwargs\.tasks\[0\]=3: must be a mapping"),
    ("env.kwargs.init={size:3}", r"^env\.kwargs\.init=\{\"size\": 3\}: Thermostat\(\.\.\.\): got an unexpected"),
    ("env.kwargs.clss=x", r"^env\.kwargs\.clss=x: unknown key of the env 'python'; did you mean env\.kwargs\.cls\?"),
])
def test_bad_settings_are_one_line_before_anything_starts(override, line):
    cls = [] if override.startswith("env.kwargs.cls=") else [f"env.kwargs.cls={THERMO}"]
    with pytest.raises(ConfigError, match=line) as err:
        load(["env=python", "template=qwen_tools", *cls, override], training=False)
    assert "\n" not in str(err.value)


def test_a_class_without_reset_stops_the_command_with_exit_2_naming_it_before_a_run_folder(tmp_path):
    (tmp_path / "my_envs.py").write_text("class Oven:\n    def bake(self, minutes: int) -> str:\n        return 'ok'\n")
    proc = subprocess.run([str(BIN / "openmanus-rl"), "train", "env=python", "env.kwargs.cls=my_envs:Oven",
                           "template=qwen_tools", f"trainer.run_dir={tmp_path / 'run'}"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)  # my_envs.py is found in the current folder
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: env.kwargs.cls=my_envs:Oven: the class Oven has no reset(**task) method")
    assert not (tmp_path / "run").exists()


def test_env_class_in_the_python_api_becomes_the_python_env():
    assert env_class_overrides(Thermostat, ["template=qwen_tools"]) == ["env=python",
                                                                        "env.kwargs.cls=readme_thermostat:Thermostat"]

    class Local:
        def reset(self):
            return ""

    for env, overrides, line in [
        (Local, [], r"^env=test_env_class_in_the_python_api_becomes_the_python_env\.<locals>\.Local: a class defined "
                    r"inside a function"),
        (Thermostat(), [], r"^env=<readme_thermostat\.Thermostat object .*>: must be a class"),
        (Thermostat, ["env=key_door"], r"^env=Thermostat: the overrides choose an env too"),
    ]:
        with pytest.raises(ConfigError, match=line):
            env_class_overrides(env, overrides)


def test_a_scripts_class_is_named_by_the_scripts_module(monkeypatch, tmp_path):
    main = type(sys)("__main__")
    main.__file__ = str(tmp_path / "heating.py")
    main.__spec__ = None
    monkeypatch.setitem(sys.modules, "__main__", main)
    Script = type("Script", (), {"__module__": "__main__", "reset": lambda self: ""})
    assert env_class_overrides(Script, []) == ["env=python", "env.kwargs.cls=heating:Script"]
    main.__spec__ = type("Spec", (), {"name": "pkg.heating"})()  # python -m pkg.heating
    assert env_class_overrides(Script, [])[1] == "env.kwargs.cls=pkg.heating:Script"
    del main.__file__
    main.__spec__ = None
    with pytest.raises(ConfigError, match=r"^env=Script: a class defined in an interactive session"):
        env_class_overrides(Script, [])


# ----------------------------------------------------------------------- the tools in the model's chat template


@pytest.fixture(scope="module")
def qwen_tokenizer():
    """A tokenizer built here (no download) carrying Qwen2.5-Instruct's own chat template."""
    tok = build_tokenizer(["The room is at 16 degrees.", "<tool_call>", '{"name": "heat"}'], vocab_size=400)
    tok.chat_template = QWEN25
    return tok


def thermostat_loop(tokenizer, replies, memory=None, **env_kwargs):
    template = build("template", {"name": "qwen_tools", "kwargs": {}})
    engine = ScriptedEngine(tokenizer, replies)
    loop = AgentLoop(engine, tokenizer, template, lambda: PythonEnv(cls=THERMO, **env_kwargs),
                     RolloutConfig(max_turns=4, max_new_tokens=64, max_prompt_tokens=4096, max_response_tokens=2048,
                                   max_sample_tokens=4096), memory=memory)
    return loop, engine


def test_the_tools_reach_the_model_through_the_qwen25_chat_template_and_its_calls_reach_the_class(qwen_tokenizer):
    r = registry("template").get("qwen_tools")().render
    replies = [[r(call("heat", degrees=3)), "I think 3 more degrees."],
               [r(call("heat", degrees=1), thought="One more."), r(call("heat", degrees=9))],
               [r(call("finish")), r(call("finish"))]]
    loop, engine = thermostat_loop(qwen_tokenizer, replies, tasks=[{"target": 20, "start": 16}])
    episodes = loop.run(expand_tasks([{"task_id": 0, "seed": 0}], 2))
    prompt = engine.prompts[0][0]
    tools = PythonEnv(cls=THERMO).tools
    expected_head = ("<|im_start|>system\nBring the room to the target temperature, then call finish.\n\n# Tools\n\n"
                     "You may call one or more functions to assist with the user query.\n\nYou are provided with "
                     "function signatures within <tools></tools> XML tags:\n<tools>\n"
                     + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + "\n</tools>")
    assert prompt.startswith(expected_head), prompt
    assert prompt.endswith("<|im_start|>user\nThe room is at 16 degrees; the target is 20.<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert prompt == qwen_tokenizer.apply_chat_template(
        [{"role": "system", "content": "Bring the room to the target temperature, then call finish."},
         {"role": "user", "content": "The room is at 16 degrees; the target is 20."}], tools=tools, tokenize=False,
        add_generation_prompt=True)
    good, bad = (ep.trajectory for ep in episodes)
    assert [t.observation for t in good.turns] == ["The room is at 19 degrees.", "The room is at 20 degrees.",
                                                    "Finished."]
    assert [t.action.content for t in good.turns][:2] == [call("heat", degrees=3), call("heat", degrees=1)]
    assert good.turns[1].action.thought == "One more." and good.termination == "done" and good.env_reward == 1.0
    assert [t.observation for t in bad.turns] == [
        "Invalid tool call: the reply is not a tool call; call one of the tools: heat(degrees), finish()",
        "Invalid tool call: heat failed: ValueError: degrees must be from 1 to 5", "Finished."]
    assert [t.action.valid for t in bad.turns] == [False, True, True] and bad.env_reward == 0.0
    # the next turn continues the same token stream: the reply, then the observation as a user turn
    assert engine.prompts[1][0].startswith(prompt) and "<|im_start|>user\nThe room is at 19 degrees.<|im_end|>" in \
        engine.prompts[1][0]


def test_a_per_turn_memory_renders_the_tools_in_every_context(qwen_tokenizer):
    memory = build("memory", {"name": "window", "kwargs": {}}, window=1)
    r = registry("template").get("qwen_tools")().render
    loop, engine = thermostat_loop(qwen_tokenizer, [[r(call("heat", degrees=2))], [r(call("finish"))]], memory=memory)
    (ep,) = loop.run([{"task_id": 0, "seed": 0}])
    assert ep.trajectory.termination == "done" and len(ep.contexts) == 2
    for context in ep.contexts:
        text = qwen_tokenizer.decode(context)
        assert '<tools>\n{"type": "function", "function": {"name": "heat"' in text and text.count("<tools>\n") == 1


PLAIN_CHATML = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                "{%- endif %}")


def test_a_chat_template_without_tools_gets_them_in_the_system_prompt_and_text_envs_get_one_act_tool():
    """key_door (actions are text) with qwen_tools and text_tool=act, under a plain ChatML template that does not
    write tools (the tiny default's does): the template's own act tool is listed in the system prompt, and the
    oracle's actions, sent as act calls, solve every task."""
    from openmanus_rl_core.rollout.chat import ChatDelta, prompt_tools

    tok = build_tokenizer(["open the door"], vocab_size=300)
    tok.chat_template = PLAIN_CHATML
    template = build("template", {"name": "qwen_tools", "kwargs": {"text_tool": "act"}})
    env = build("env", {"name": "key_door", "kwargs": {}})
    chat = ChatDelta(tok)
    assert chat.renders_tools is False
    system, tools = prompt_tools(template, env, chat, template.system_prompt(env.instruction))
    assert tools is None and system == f"{env.instruction}\n\n{template.tool_prompt(template.tools)}"
    trajs = oracle_rollout(lambda: build("env", {"name": "key_door", "kwargs": {}}),
                           [{"task_id": i, "seed": 0} for i in range(3)], template, tok, max_turns=12)
    assert all(t.success and t.termination == "done" for t in trajs)
    assert all(t.turns[0].action.kind == "tool_call" and t.turns[0].response.startswith("<tool_call>\n{\"name\": "
                                                                                         "\"act\"") for t in trajs)
    # with the Qwen template the same act tool goes through the chat template; the env's own tools come first
    tok.chat_template = QWEN25
    qchat = ChatDelta(tok)
    assert prompt_tools(template, env, qchat, "S") == ("S", template.tools)
    assert prompt_tools(template, PythonEnv(cls=THERMO), qchat, "S")[1] == PythonEnv(cls=THERMO).tools
    plain = build("template", {"name": "qwen_tools", "kwargs": {}})
    with pytest.raises(ValueError, match=r"the env KeyDoorEnv has no `tools`; .*template\.kwargs\.text_tool=act"):
        prompt_tools(plain, env, qchat, "S")
    react = build("template", {"name": "react", "kwargs": {}})
    assert prompt_tools(react, PythonEnv(cls=THERMO), qchat, "S") == ("S", None)


# --------------------------------------------------------------------------- the documented class, trained
DOC = HERE.parents[3] / "docs" / "ecosystem-envs.md"  # where the env=python example lives


def readme_script() -> str:
    """readme_thermostat.py without its docstring: docs/ecosystem-envs.md's example as written."""
    return (HERE / "readme_thermostat.py").read_text().split('"""', 2)[2].lstrip("\n")


def test_the_docs_show_this_very_script():
    import re

    blocks = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "class Thermostat" in b]
    assert blocks == [readme_script()]


@pytest.mark.ray
def test_the_documented_class_trains_from_python(tmp_path):
    """docs/ecosystem-envs.md's script (readme_thermostat.py) run as a script: it writes its task file of rooms with
    demonstrations, and ``omrl.train(..., env=Thermostat)`` makes the run's workers import the class by the script's
    module name; the warm-up trains on the file's demonstrations. Only its run is made small."""
    run = tmp_path / "run"
    small = [o for o in SMALL_RUN if not o.startswith(("env=", "trainer.total_steps=", "trainer.num_cpus="))] + [
        "trainer.total_steps=1", "trainer.num_workers=1", "trainer.num_cpus=1", "trainer.loggers=[]",
        "env.max_turns=2", "rollout.max_prompt_tokens=896", "rollout.max_response_tokens=128",
        f"trainer.run_dir={run}"]
    prelude = textwrap.dedent(f"""
        import openmanus_rl_core.api as api
        _train = api.train
        api.train = lambda overrides=None, **kw: _train([*(overrides or []), *{small!r}], **kw)
    """)
    script = tmp_path / "heating.py"
    script.write_text(prelude + readme_script())
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    config = json.loads((run / "config.json").read_text())
    assert config["env"]["name"] == "python" and config["env"]["kwargs"]["cls"] == "heating:Thermostat"
    assert config["data"]["train_files"] == config["data"]["val_files"] == "rooms.parquet"
    # the task file: 16 rounds of the four rooms, each row with the expert's episode the class itself played
    from openmanus_rl_core.data.tasks import load_tasks

    rows = load_tasks(tmp_path / "rooms.parquet")
    assert len(rows) == 64 and [(r["target"], r["start"]) for r in rows[:5]] == [(20, 16), (22, 19), (23, 18),
                                                                                 (21, 20), (20, 16)]
    assert rows[2]["demonstration"] == {"observation": "The room is at 18 degrees; the target is 23.", "steps": [
        ['{"name": "heat", "arguments": {"degrees": 5}}', "The room is at 23 degrees."],
        ['{"name": "finish", "arguments": {}}', "Finished."]]}
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    # the warm-up trained on those demonstrations (without them env=python has none, and it is skipped)
    assert records[0]["step"] == 0 and records[0]["warmup/loss"] > 0
    assert records[-1]["step"] == 1 and "train/reward/goal/mean" in records[-1]
    assert proc.stdout.strip().splitlines()[-1] == f"{records[-1]['val/reward_mean']} {records[-1]['val/success_rate']}"
    val = sorted((run / "validation").glob("*.jsonl"))[-1]
    episodes = [json.loads(x) for x in val.read_text().splitlines() if x.strip()]
    # trainer.val_max_tasks=4: the file's first four rows, the four rooms, each reset() with its row's columns
    assert sorted(ep["initial_observation"] for ep in episodes) == [
        "The room is at 16 degrees; the target is 20.", "The room is at 18 degrees; the target is 23.",
        "The room is at 19 degrees; the target is 22.", "The room is at 20 degrees; the target is 21."]
    for ep in episodes:
        # the tiny default's ChatML template writes the tools itself, after the system message, whole
        context = ep["turns"][0]["context"]
        assert context.startswith("<|im_start|>system\nBring the room to the target temperature, then call finish."
                                  "\n\n# Tools\n<tools>\n")
        assert '{"type": "function", "function": {"name": "finish"' in context and "prompt_truncated" not in ep["info"]
        # each observation came from the class: a tool's answer, or why the call was refused
        for turn in ep["turns"][:-1]:
            assert turn["observation"].startswith(("Invalid tool call: ", "The room is at ", "Finished.")), turn
        last = ep["turns"][-1]["observation"]  # none after an empty reply or one cut at the token limit
        assert last.startswith(("Invalid tool call: ", "The room is at ", "Finished.")) or (
            last == "" and ep["termination"] in ("invalid", "truncated")), ep
