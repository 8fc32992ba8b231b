"""Every phase before the first training step shows it is alive: the tokenizer corpus, the model build, the
warm-up and validation each log a progress line at least every alive.EVERY_S seconds (issue 46)."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from openmanus_rl_core.process import alive
from openmanus_rl_core.process.alive import Alive


def counts(lines: list[str], pattern: str) -> list[int]:
    """The first number of every line that matches ``pattern`` (other lines are ignored)."""
    return [int(m.group(1)) for m in map(re.compile(pattern).fullmatch, lines) if m]


def test_alive_logs_the_count_once_every_every_s():
    now = [100.0]
    lines: list[str] = []
    alive = Alive(lines.append, "building the tokenizer corpus", total=200, unit="episodes", every_s=10,
                  clock=lambda: now[0])
    for done in range(1, 201):
        now[0] += 0.125  # 25 s in all
        alive.update(done)
    assert lines == ["building the tokenizer corpus: 80/200 episodes, 10s",
                     "building the tokenizer corpus: 160/200 episodes, 20s"]
    alive.say("warm-up step 5/5: loss 0.1")  # a phase's own line restarts the count
    now[0] += 9.0
    alive.update(note="loss 0.53")
    assert lines[-1] == "warm-up step 5/5: loss 0.1"
    now[0] += 1.0
    alive.update()
    assert lines[-1] == "building the tokenizer corpus: 200/200 episodes, loss 0.53, 35s"
    Alive(None, "silent", every_s=0).update(3)  # no log function: nothing to call


def test_alive_logs_while_a_call_blocks():
    lines: list[str] = []
    with Alive(lines.append, "validation", note="60 tasks", every_s=0.05):
        time.sleep(0.6)
    assert len(lines) >= 3 and all(re.fullmatch(r"validation: 60 tasks, [01]s", line) for line in lines), lines
    settled = len(lines)
    time.sleep(0.2)
    assert len(lines) == settled  # the ticker stopped with the phase


@pytest.fixture
def every_update(monkeypatch):
    """A line at every update (the phases' own Alive objects read alive.EVERY_S)."""
    monkeypatch.setattr(alive, "EVERY_S", 0.0)


def key_door():
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.plugin.registry import build

    cfg = load(["env=key_door", "model.tiny.vocab_size=300"])
    return cfg, (lambda: build("env", cfg.env)), build("template", cfg.template)


def test_the_corpus_counts_its_episodes(tmp_path, every_update):
    from openmanus_rl_core.run.model_folder import prepare_model_dir

    cfg, env_factory, template = key_door()
    tasks = [{"task_id": i, "seed": 0} for i in range(6)]
    lines: list[str] = []
    prepare_model_dir(cfg, tmp_path, tasks, env_factory, template, lines.append)
    assert counts(lines, r"building the tokenizer corpus: (\d+)/12 episodes, \d+s") == list(range(1, 13))


def test_the_model_build_says_it_is_alive_while_it_builds(tmp_path, monkeypatch):
    from openmanus_rl_core.models import loading as models
    from openmanus_rl_core.run.model_folder import prepare_model_dir

    real = models.load_model_and_tokenizer

    def slow(*args, **kwargs):  # a large tokenizer corpus, a slow disk
        time.sleep(0.6)
        return real(*args, **kwargs)

    monkeypatch.setattr(models, "load_model_and_tokenizer", slow)
    monkeypatch.setattr(alive, "EVERY_S", 0.05)
    cfg, env_factory, template = key_door()
    lines: list[str] = []
    prepare_model_dir(cfg, tmp_path, [{"task_id": 0, "seed": 0}], env_factory, template, lines.append)
    built = [line for line in lines if line.startswith("building the tiny model: ")]
    assert len(built) >= 3, lines
    assert re.fullmatch(r"building the tiny model: its tokenizer from \d+ corpus texts, \ds", built[0])


def test_the_warm_up_reports_its_demonstrations_then_its_steps_and_loss(every_update):
    from openmanus_rl_core.models.loading import build_tokenizer
    from openmanus_rl_core.rollout import tokenizer_corpus
    from openmanus_rl_core.run.warmup import build_demonstrations, run_warmup

    cfg, env_factory, template = key_door()
    tasks = [{"task_id": i, "seed": 0} for i in range(4)]
    tok = build_tokenizer(tokenizer_corpus(env_factory, template, tasks), vocab_size=300)
    lines: list[str] = []
    demos = build_demonstrations(env_factory, template, tok, tasks, cfg.rollout.max_turns, log=lines.append)
    assert len(demos) == 4
    assert counts(lines, r"warm-up demonstrations: (\d+)/4 tasks, \d+s") == [1, 2, 3, 4]
    losses = iter([0.9, 0.7, 0.5, 0.3, 0.1])

    def step_fn(shards, lr):
        return [{"loss": next(losses), "token_acc": 0.5}]

    lines.clear()
    run_warmup(step_fn, demos, tok.pad_token_id, world_size=1, steps=5, batch_size=2, lr=1e-3, seed=0,
               log=lines.append)
    steps = [line for line in lines if re.fullmatch(r"warm-up: \d/5 steps, loss [\d.]+, \d+s", line)]
    assert [line.split(", ")[:2] for line in steps] == [
        [f"warm-up: {k}/5 steps", f"loss {loss:.4f}"] for k, loss in zip(range(1, 6), [0.9, 0.7, 0.5, 0.3, 0.1])]


def test_validation_says_it_is_alive_while_the_workers_play(monkeypatch):
    from openmanus_rl_core.run.validation import validate

    class Stop(Exception):
        pass

    def rollout(tasks, overrides, keep_rng):
        time.sleep(0.6)  # the actor ranks play the validation episodes
        raise Stop  # what comes after (scoring, files) is not this test's

    monkeypatch.setattr(alive, "EVERY_S", 0.05)
    lines: list[str] = []
    cfg = SimpleNamespace(trainer=SimpleNamespace(val_greedy=True, val_temperature=0.0))
    trainer = SimpleNamespace(cfg=cfg, val_tasks=[{"task_id": i, "seed": 0} for i in range(3)], log=lines.append,
                              _rollout=rollout)
    with pytest.raises(Stop):
        validate(trainer, 0)
    assert len(lines) >= 3 and set(lines) <= {"validation: 3 tasks, 0s", "validation: 3 tasks, 1s"}, lines
    lines.clear()
    with pytest.raises(Stop):
        validate(trainer, 0, prefix="warmup/val")
    assert lines and set(lines) <= {"validation (warmup/val): 3 tasks, 0s", "validation (warmup/val): 3 tasks, 1s"}
