"""metrics.jsonl, TensorBoard, the reward plot, progress bar, timers, reduction and the run directory."""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from openmanus_rl_core.run.metrics import (MetricsLogger, Timer, make_run_dir, plot_rewards, read_metrics,
                                       reduce_metrics)
from openmanus_rl_core.run.progress import ProgressBar


def test_metrics_jsonl_content(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"train/reward_mean": 0.5, "train/turns": 2, "kl": torch.tensor(0.25),
                       "entropy": np.float32(1.5), "loss": float("nan"), "grad": float("inf"), "ok": True})
        logger.log(2, {"train": {"reward_mean": 0.75}, "timing": {"gen": 3}})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines[0] == ('{"step": 1, "train/reward_mean": 0.5, "train/turns": 2.0, "kl": 0.25, "entropy": 1.5, '
                        '"loss": null, "grad": null, "ok": 1.0}')
    assert json.loads(lines[1]) == {"step": 2, "train/reward_mean": 0.75, "timing/gen": 3.0}


def test_non_numeric_metric_is_refused_by_name(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        with pytest.raises(TypeError, match=r"metric 'env' = 'word_copy' \(str\) is not a number"):
            logger.log(1, {"env": "word_copy"})
        with pytest.raises(TypeError, match="metric 'v'"):
            logger.log(1, {"v": torch.ones(3)})


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        logger.log(1, {"train/reward_mean": 0.5, "loss": float("nan")})
        logger.log(2, {"train/reward_mean": 0.75})
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["train/reward_mean"]  # NaN is not sent to TensorBoard
    assert [(e.step, e.value) for e in acc.Scalars("train/reward_mean")] == [(1, 0.5), (2, 0.75)]


def test_resume_drops_steps_after_the_checkpoint_and_torn_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a": 3.0}\n{"step": 4, "a"')
    with MetricsLogger(tmp_path, tensorboard=False, resume_step=2) as logger:
        logger.log(3, {"a": 30.0})
    assert [(r["step"], r["a"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    # without resume_step only the torn line goes, and appending starts on a fresh line
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a"')
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(2, {"a": 2.0})
    assert path.read_text() == '{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n'


def test_plot_rewards_writes_a_png(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(1, 6):
            m = {"train/reward_mean": step / 5}
            if step % 2 == 1:
                m.update({"val/reward_mean": step / 6, "val/success_rate": step / 7})
            logger.log(step, m)
    png = plot_rewards(tmp_path)
    assert png == tmp_path / "rewards.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    empty = tmp_path / "empty"
    empty.mkdir()
    assert plot_rewards(empty).read_bytes()[:4] == b"\x89PNG"  # no metrics yet: still a (labelled) picture


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_shows_step_reward_and_success():
    buf = _Terminal()
    with ProgressBar(total=10, file=buf, disable=False) as bar:
        bar.update(1, {"train/reward_mean": 0.25, "train/success_rate": 0.5})
        bar.update(2, {"train/reward_mean": 0.5, "train/success_rate": 0.75, "val/reward_mean": 0.125})
        bar.write("a message")
    text = buf.getvalue()
    assert "2/10" in text and "step=2" in text and "reward=0.500" in text and "success=0.750" in text
    assert "val_reward=0.125" in text and "a message" in text


def test_progress_bar_prints_plain_step_lines_when_the_console_is_not_a_terminal():
    """Redirected to a file, the console gets one line per step, never tqdm's carriage-return redraws."""
    console, lines = io.StringIO(), io.StringIO()
    with ProgressBar(total=10, file=console, disable=False, lines=lines) as bar:
        bar.update(1, {"train/reward_mean": 0.25, "train/success_rate": 0.5})
        bar.update(2, {"train/reward_mean": 0.5, "train/success_rate": 0.75, "timing/step": 1.5})
    assert lines.getvalue() == ("step 1/10: reward 0.250, success 0.500\n"
                                "step 2/10: reward 0.500, success 0.750, 1.50s\n")
    assert console.getvalue() == ""


def test_the_first_stream_step_is_flagged_in_the_step_line():
    metrics = {"train/reward_mean": 0.9, "train/success_rate": 1.0, "timing/step": 2.0}
    with ProgressBar(total=4, file=io.StringIO(), lines=io.StringIO()) as bar:
        assert bar.step_line(1, {**metrics, "stream/first_batch": 1.0}) == (
            "step 1/4: reward 0.900, success 1.000, 2.00s, first stream step: fastest groups")
        assert bar.step_line(2, {**metrics, "stream/first_batch": 0.0}) == (
            "step 2/4: reward 0.900, success 1.000, 2.00s")


def test_timer_accumulates_phases():
    into = {}
    timer = Timer(into=into)
    with timer("gen"):
        time.sleep(0.02)
    with timer("gen"):
        time.sleep(0.02)
    with timer("update"):
        pass
    m = timer.metrics()
    assert set(m) == {"timing/gen", "timing/update"} and into == m
    assert 0.04 <= m["timing/gen"] < 0.5 and m["timing/update"] < 0.01
    with pytest.raises(ValueError):
        with timer("boom"):
            raise ValueError
    assert "timing/boom" in timer.metrics()  # a failing phase is still timed
    timer.reset()
    assert timer.metrics() == {}


def test_reduce_metrics_means():
    out = reduce_metrics([{"a": 1, "b": 2.0, "c": None}, {"a": 3, "d": float("nan")}, {"a": torch.tensor(5.0)}])
    assert out["a"] == 3.0 and out["b"] == 2.0
    assert math.isnan(out["c"]) and math.isnan(out["d"])
    assert reduce_metrics([]) == {}


def test_make_run_dir(tmp_path, capsys):
    cfg = OmegaConf.create({"env": {"name": "word_copy"}, "trainer": {"run_dir": None, "output_dir": str(tmp_path)}})
    now = dt.datetime(2024, 5, 6, 7, 8, 9)
    a = make_run_dir(cfg, now=now)
    b = make_run_dir(cfg, now=now)
    assert a == tmp_path / "2024-05-06" / "07-08-09-word_copy" and a.is_dir()
    assert b == tmp_path / "2024-05-06" / "07-08-09-word_copy-1"
    assert f"run directory: {a}" in capsys.readouterr().out
    cfg.trainer.run_dir = str(tmp_path / "mine")
    assert make_run_dir(cfg) == tmp_path / "mine" and make_run_dir(cfg) == tmp_path / "mine"  # resume reuses it


def test_learning_signal_watch_warns_once_per_streak_of_zero_advantages():
    from openmanus_rl_core.run.metrics import LearningSignalWatch

    watch = LearningSignalWatch(patience=3)
    dead = {"train/zero_adv_frac": 1.0, "train/reward_mean": -0.1, "train/reward_std": 0.0,
            "train/reward/goal/mean": 0.0, "train/reward/format/mean": -0.1, "train/reward/goal/errors": 0.0}
    live = dict(dead, **{"train/zero_adv_frac": 0.5})
    out = [watch.update(s, m) for s, m in enumerate([dead, dead, live, dead, dead, dead, dead, dead, dead], 1)]
    # Steps 1-2 dead, 3 live (the streak resets), 4-6 dead: the warning comes at step 6, once for that streak.
    assert [i + 1 for i, w in enumerate(out) if w] == [6]
    msg = out[5]
    assert msg.startswith("WARNING: no learning signal for 3 steps (up to step 6)")
    assert "mean -0.100, std 0.000" in msg and "components (mean): format -0.100, goal 0.000" in msg
    assert "raise rollout.n" in msg
    # A new streak after a live step warns again; patience 0 and a run without the metric never warn.
    assert [watch.update(s, m) is not None for s, m in [(10, live), (11, dead), (12, dead), (13, dead)]] == \
        [False, False, False, True]
    off = LearningSignalWatch(patience=0)
    assert all(off.update(s, dead) is None for s in range(10))
    assert LearningSignalWatch(1).update(1, {"train/reward_mean": 0.0}) is None


def test_the_plot_gives_the_warm_up_its_own_segment_and_integer_steps(tmp_path):
    """Untrained val 0.1 -> after the warm-up 0.7 -> RL 0.9 at step 3: the warm-up's gain is drawn as the warm-up's,
    and the RL curve starts where the warm-up left it."""
    from openmanus_rl_core.run.metrics import reward_figure, reward_series

    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, {"val/reward_mean": 0.1, "val/success_rate": 0.0, "warmup/val/reward_mean": 0.7,
                       "warmup/val/success_rate": 0.5})
        for step in (1, 2, 3):
            logger.log(step, {"train/reward_mean": 0.6 + step / 10, "train/reward/goal/mean": step / 10,
                              "train/reward/goal/raw_mean": step / 10, "train/reward/format/mean": 0.05})
        logger.log(3, {"val/reward_mean": 0.9, "val/success_rate": 0.8})
    series = {label: (xs, ys) for label, xs, ys, _, _ in reward_series(read_metrics(tmp_path))}
    assert series["warm-up (reward)"] == ([0, 0], [0.1, 0.7])
    assert series["warm-up (success rate)"] == ([0, 0], [0.0, 0.5])
    assert series["val reward"] == ([0, 3], [0.7, 0.9])
    assert series["val success rate"] == ([0, 3], [0.5, 0.8])
    assert series["train reward"][0] == [1, 2, 3]
    assert series["train goal"] == ([1, 2, 3], [0.1, 0.2, 0.3])  # each component too
    assert series["train format"] == ([1, 2, 3], [0.05, 0.05, 0.05])
    assert not any(label.endswith("raw_mean") for label in series)
    fig = reward_figure(tmp_path)
    fig.canvas.draw()
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
    # Without a warm-up the curves are as logged.
    run = tmp_path / "plain"
    with MetricsLogger(run, tensorboard=False) as logger:
        logger.log(0, {"val/reward_mean": 0.1})
        logger.log(2, {"val/reward_mean": 0.3})
    assert [(label, xs, ys) for label, xs, ys, _, _ in reward_series(read_metrics(run))] == [
        ("val reward", [0, 2], [0.1, 0.3])]


def test_the_reward_plot_legend_stays_off_the_curves(tmp_path):
    """The legend sits outside the axes (and inside the saved picture), however many curves there are."""
    from openmanus_rl_core.run.metrics import reward_figure

    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(1, 9):
            logger.log(step, {"train/reward_mean": step / 8, "train/reward/goal/mean": step / 10,
                              "train/reward/format/mean": 0.05, "train/reward/invalid_action/mean": -0.02,
                              "val/reward_mean": step / 9, "val/success_rate": step / 10})
    fig = reward_figure(tmp_path)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    box, axes_box = legend.get_window_extent(), ax.get_window_extent()
    assert len(legend.get_texts()) == 6
    assert not box.overlaps(axes_box), (box, axes_box)
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1


def test_the_success_interval_is_wilsons_and_stays_inside_0_1():
    from openmanus_rl_core.run.metrics import success_interval

    assert success_interval([True] * 8 + [False] * 2) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert success_interval([True] * 31 + [False] * 9) == pytest.approx((0.6250, 0.8768), abs=1e-4)  # 0.775 on 40 tasks
    low, high = success_interval([False] * 40)  # no successes: a real upper bound, not a point at 0
    assert low == 0.0 and high == pytest.approx(0.0876, abs=1e-4)
    assert success_interval([True] * 120)[0] == pytest.approx(0.9690, abs=1e-4)
    assert all(x != x for x in success_interval([]))
