"""Every hook is typed, documented where declared, prefixed with the project name, and covered here."""

import inspect
from pathlib import Path

from openmanus_rl_core import hookspecs
from openmanus_rl_core.hookspecs import hookimpl
from openmanus_rl_core.plugin.manager import make_plugin_manager

HOOKS = [n for n, f in vars(hookspecs).items() if inspect.isfunction(f) and hasattr(f, "openmanus_rl_spec")]


def test_hooks_are_prefixed_typed_and_documented():
    assert len(HOOKS) >= 6
    for name in HOOKS:
        fn = getattr(hookspecs, name)
        assert name.startswith("openmanus_rl_"), name
        assert fn.__doc__ and len(fn.__doc__.strip()) > 40, f"{name} lacks documentation"
        sig = inspect.signature(fn)
        assert sig.return_annotation is not inspect.Signature.empty, f"{name} lacks a return type"
        for p in sig.parameters.values():
            assert p.annotation is not inspect.Parameter.empty, f"{name}({p.name}) lacks a type"


def test_every_hook_is_exercised_by_a_test():
    # a hook counts as tested when some test calls it through a plugin manager
    tests = "".join(p.read_text() for p in Path(__file__).parent.rglob("test_*.py"))
    missing = [h for h in HOOKS if f"hook.{h}(" not in tests]
    assert not missing, f"hooks without a test: {missing}"


class Recorder:
    def __init__(self):
        self.calls = []

    @hookimpl
    def openmanus_rl_config_dirs(self):
        return ["/tmp/recorder-configs"]

    @hookimpl
    def openmanus_rl_run_start(self, cfg, run_dir):
        self.calls.append(("start", run_dir))

    @hookimpl
    def openmanus_rl_process_trajectories(self, trajectories, step):
        trajectories.reverse()
        self.calls.append(("process", step))

    @hookimpl
    def openmanus_rl_rollout_end(self, trajectories, metrics, step):
        self.calls.append(("rollout_end", metrics["x"]))

    @hookimpl
    def openmanus_rl_step_end(self, step, metrics):
        self.calls.append(("step", step))

    @hookimpl
    def openmanus_rl_run_end(self, run_dir, metrics):
        self.calls.append(("end", run_dir))


def test_a_registered_plugin_receives_every_lifecycle_hook():
    pm = make_plugin_manager(load_entry_points=False)
    rec = Recorder()
    pm.register(rec)
    trajs = [1, 2, 3]
    pm.hook.openmanus_rl_run_start(cfg={}, run_dir="r")
    pm.hook.openmanus_rl_process_trajectories(trajectories=trajs, step=1)
    pm.hook.openmanus_rl_rollout_end(trajectories=trajs, metrics={"x": 0.5}, step=1)
    pm.hook.openmanus_rl_step_end(step=1, metrics={})
    pm.hook.openmanus_rl_run_end(run_dir="r", metrics={})
    assert pm.hook.openmanus_rl_config_dirs() == [["/tmp/recorder-configs"]]
    assert trajs == [3, 2, 1]
    assert rec.calls == [("start", "r"), ("process", 1), ("rollout_end", 0.5), ("step", 1), ("end", "r")]


def test_config_dirs_from_plugins_reach_the_search_path(tmp_path):
    from openmanus_rl_core.config.loading import plugin_config_dirs

    pm = make_plugin_manager(load_entry_points=False)
    pm.register(Recorder())
    assert plugin_config_dirs(pm) == ["file:///tmp/recorder-configs"]


class Keeper:
    """A plugin that keeps a counter in every checkpoint and gets it back on resume."""

    def __init__(self, key="keeper"):
        self.key, self.count, self.restored = key, 0, []

    @hookimpl
    def openmanus_rl_checkpoint_save(self, cfg, run_dir, step):
        return {self.key: {"count": self.count, "blob": b"\x00\x01"}}

    @hookimpl
    def openmanus_rl_checkpoint_restore(self, cfg, run_dir, step, state):
        self.restored.append((step, state.get(self.key)))


def test_checkpoint_hooks_keep_a_plugins_state_in_the_checkpoint_and_give_it_back(tmp_path):
    """What the save hook returns is written with the checkpoint (as its ``plugins`` entry, read back with
    weights_only) and handed to the restore hook; two plugins keeping one key is an error naming it."""
    from types import SimpleNamespace

    import pytest

    from openmanus_rl_core.checkpoint.store import CheckpointError, load_checkpoint, save_checkpoint
    from openmanus_rl_core.run.state import plugin_states

    pm = make_plugin_manager(load_entry_points=False)
    keeper = Keeper()
    keeper.count = 7
    pm.register(keeper)
    trainer = SimpleNamespace(pm=pm, cfg={}, run_dir=tmp_path)
    assert pm.hook.openmanus_rl_checkpoint_save(cfg={}, run_dir=str(tmp_path), step=3) == [
        {"keeper": {"count": 7, "blob": b"\x00\x01"}}]
    save_checkpoint(tmp_path, 3, {"plugins": plugin_states(trainer, 3)})
    state = load_checkpoint(tmp_path)["plugins"]
    pm.hook.openmanus_rl_checkpoint_restore(cfg={}, run_dir=str(tmp_path), step=3, state=state)
    assert keeper.restored == [(3, {"count": 7, "blob": b"\x00\x01"})]
    pm.register(Keeper())
    with pytest.raises(CheckpointError, match="two plugins keep an entry 'keeper' in the checkpoint of step 3"):
        plugin_states(trainer, 3)
