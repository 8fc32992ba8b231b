"""``trainer.loggers=[tensorboard]``: the run's config as text and its hyper-parameters against the final metrics,
in the TensorBoard folder of the run, read back with TensorBoard's own event reader."""

from __future__ import annotations

from openmanus_rl_core.config.loading import compose
from openmanus_rl_core.plugin.manager import make_plugin_manager


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


def _run(run_dir, loggers: str, *settings: str) -> None:
    cfg = compose([f"trainer.loggers={loggers}", "actor.lr=0.003", "env=word_copy", *settings])
    pm = make_plugin_manager()
    pm.hook.openmanus_rl_run_start(cfg=cfg, run_dir=str(run_dir))
    pm.hook.openmanus_rl_step_end(step=1, metrics={"train/reward_mean": 0.25})
    pm.hook.openmanus_rl_run_end(run_dir=str(run_dir), metrics={"val/success_rate": 0.75, "train/kl": float("nan")})


def test_the_config_text_and_the_hparams_are_in_the_runs_tensorboard_folder(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    _run(tmp_path, "[tensorboard]")
    acc = _events(tmp_path / "tensorboard")
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert text.startswith("```yaml\n") and "lr: 0.003" in text and "name: word_copy" in text
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["actor.lr"].number_value == 0.003
    assert hparams["env.name"].string_value == "word_copy"
    assert hparams["trainer.loggers"].string_value == '["tensorboard"]'
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == ["final/val/success_rate"]  # the NaN is left out
    assert [e.value for e in acc.Scalars("final/val/success_rate")] == [0.75]


def test_not_selected_it_writes_no_config_or_hparams(tmp_path):
    _run(tmp_path, "[]")
    assert not (tmp_path / "tensorboard").exists()


def test_its_settings_turn_the_config_text_or_the_hparams_off(tmp_path):
    _run(tmp_path / "a", "[tensorboard]", "trainer.tracker_kwargs.tensorboard.hparams=false")
    acc = _events(tmp_path / "a" / "tensorboard")
    assert acc.Tags()["tensors"] == ["config/text_summary"] and acc.Tags()["scalars"] == []
    _run(tmp_path / "b", "[tensorboard]", "trainer.tracker_kwargs.tensorboard.config_text=false")
    acc = _events(tmp_path / "b" / "tensorboard")
    assert acc.Tags()["tensors"] == [] and acc.Tags()["scalars"] == ["final/val/success_rate"]
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")
