"""One training step of the real trainer (Ray, FSDP2 workers) on 60-turn relay episodes with ``memory=window``, a
per-sample budget of 1024 tokens and a chat template that drops earlier ``<think>`` blocks; prints a JSON summary.

    python tests/long_episode_run.py RUN_DIR [override ...]

tests/test_long_episodes.py calls :func:`main` in pytest's process, on the tests' shared Ray. The summary holds
each episode's turns, termination and truncation, the batch's rows and longest sample, the largest gap per turn
sample between the engine's log-probs and the actor's recomputed ones, the step's metrics, and each actor worker's
peak resident memory (``VmHWM`` of its process).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import thinking_model  # noqa: E402


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def main(run_dir: str, overrides: list[str]) -> dict:
    from openmanus_rl_core.config.loading import compose
    from openmanus_rl_core.run.trainer import Trainer

    model_dir = Path(run_dir) / "thinking-model"
    model, tok = thinking_model.build()
    model.save_pretrained(str(model_dir))
    tok.save_pretrained(str(model_dir))
    cfg = compose(["env=relay", "memory=window", "memory.window=4", "rollout.max_sample_tokens=1024",
                   "rollout.max_new_tokens=32", "env.max_turns=60", f"model.path={model_dir}", "algorithm=grpo",
                   "algorithm.n=2", "data.train_batch_size=2", "env.train_tasks=8", "env.val_tasks=2",
                   "algorithm.recompute_old_log_probs=true", "warmup.enabled=false", "trainer.total_steps=1",
                   "trainer.val_freq=0", "trainer.val_before_train=false", "trainer.val_at_end=false",
                   "trainer.save_at_end=false", "trainer.progress=false", "trainer.loggers=[]",
                   "trainer.num_cpus=2", "trainer.num_workers=2", f"trainer.run_dir={run_dir}/run", *overrides])
    trainer = Trainer(cfg)
    seen: list = []
    try:
        trainer.setup()
        estimator = trainer.estimator

        def recording(batch, **kw):
            seen.append(batch)
            return estimator(batch, **kw)

        trainer.estimator = recording
        trainer.skipped_steps = 0  # fit() starts this count
        metrics = trainer.train_step(1)
        peaks = [peak_rss_mb(p["pid"]) for p in trainer.actor.call("ping")]
    finally:
        trainer.shutdown()
    (batch,) = seen
    mask = batch["response_mask"]
    gap = ((batch["old_log_probs"] - batch["rollout_log_probs"]).abs() * mask).amax(-1)
    by_episode: dict = {}
    for e, n, term in zip(batch["episode_ids"], batch["num_turns"], batch["termination"]):
        by_episode[e] = (int(n), str(term))
    return {
        "episodes": [{"turns": n, "termination": t} for n, t in by_episode.values()],
        "rows": len(batch),
        "longest_sample_tokens": int(batch["attention_mask"].sum(-1).max()),
        "max_logprob_gap_per_row": [float(x) for x in gap],
        "metrics": {k: v for k, v in metrics.items() if k.startswith(("actor/", "rollout/", "train/", "perf/"))},
        "worker_peak_rss_mb": peaks,
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1], sys.argv[2:])))
