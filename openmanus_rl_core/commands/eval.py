"""``openmanus-rl eval``: a checkpoint (or a Hugging Face folder) on the env's validation tasks, in this process."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from openmanus_rl_core.config import check
from openmanus_rl_core.trainer import mean, quiet_transformers, seed_all


def evaluate(cfg: Any) -> int:
    """``openmanus-rl eval trainer.checkpoint=<checkpoint or run dir>``: run the env's validation tasks.

    Loads the model (from the checkpoint's model folder plus its weights, or ``model.path``) into one in-process
    rollout engine, runs every validation task greedily (``trainer.val_greedy``), and prints the success rate and
    the mean reward (also written as JSON to ``trainer.eval_output`` when set).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from openmanus_rl_core.checkpoint import open_checkpoint
    from openmanus_rl_core.data import ensure_task_files, load_tasks, require_tasks
    from openmanus_rl_core.envs import open_env_service
    from openmanus_rl_core.models import _dtype, load_tokenizer, lora_scaling, merge_lora_state
    from openmanus_rl_core.registry import build, registry
    from openmanus_rl_core.rewards import RewardComposer
    from openmanus_rl_core.rollout import AgentLoop, expand_tasks

    quiet_transformers()
    c = check(cfg, training=False)
    seed_all(c.seed)
    ckpt = c.trainer.checkpoint
    model_cfg = c.model
    state = None
    if ckpt:
        path, state = open_checkpoint(str(ckpt), keys=["model", "meta"])
        meta = state["meta"] or {}
        model_dir = meta.get("model_dir")
        saved_cfg = meta.get("config") or {}
        if saved_cfg.get("model"):  # LoRA and dtype as the checkpoint was trained
            saved = {k: v for k, v in saved_cfg["model"].items() if k in ("dtype", "lora")}
            model_cfg = dataclasses.replace(c.model, dtype=saved.get("dtype", c.model.dtype),
                                            lora=dataclasses.replace(c.model.lora, **saved.get("lora", {})))
        if not model_dir or not Path(model_dir).exists():
            cand = Path(path).parent.parent / "model"
            if not cand.exists():
                raise FileNotFoundError(f"{path}: its model folder {model_dir!r} is gone and {cand} does not exist; "
                                        "pass model.path=<the HF folder the run started from>")
            model_dir = str(cand)
        print(f"checkpoint: {path} (step {meta.get('step')})")
    elif c.model.path:
        model_dir = str(Path(c.model.path).expanduser())
    else:
        raise SystemExit("eval needs trainer.checkpoint=<checkpoint folder or run directory> or model.path=<HF folder>")

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=_dtype(model_cfg.dtype))
    device = "cuda" if torch.cuda.is_available() and c.trainer.device != "cpu" else "cpu"
    engine = build("engine", {"name": c.rollout.engine, "kwargs": c.rollout.engine_kwargs}, model=model,
                   tokenizer=tokenizer, device=device, seed=c.seed)
    if state is not None:  # a LoRA run's checkpoint holds the adapters: the engine gets them merged
        weights = state["model"]
        engine.update_weights(merge_lora_state(weights, lora_scaling(model_cfg.lora)) if model_cfg.lora.enabled
                              else weights)

    out_dir = Path(c.trainer.run_dir or (Path(ckpt).parent.parent if ckpt else "outputs/eval"))
    val_files = c.data.val_files or ensure_task_files(c, out_dir / "data")[1]
    tasks = require_tasks(load_tasks(val_files), val_files, "eval runs the validation tasks; give a file with tasks "
                          "(data.val_files, or env.val_tasks > 0)")
    if c.trainer.val_max_tasks:
        tasks = tasks[: c.trainer.val_max_tasks]
    template = build("template", c.template)
    rcfg = dataclasses.replace(c.rollout, n=1, greedy=c.trainer.val_greedy, temperature=c.trainer.val_temperature)
    service = open_env_service(c.env.name, registry("env").get(c.env.name), c.env.kwargs)
    c.env.kwargs = service.kwargs
    loop = AgentLoop(engine, tokenizer, template, lambda: build("env", c.env), rcfg)
    t0 = time.perf_counter()
    try:
        episodes = loop.run(expand_tasks([dict(t, group_id=f"eval:{i}") for i, t in enumerate(tasks)], 1))
    finally:
        service.close()
    composer = RewardComposer.from_config(c.reward.components)
    breakdowns, rmetrics = composer.compose_batch([e.trajectory for e in episodes])
    result = {
        "tasks": len(episodes),
        "success_rate": mean([bool(e.trajectory.success) for e in episodes]),
        "reward_mean": mean([b.total for b in breakdowns]),
        "num_turns": mean([e.trajectory.num_turns for e in episodes]),
        "seconds": time.perf_counter() - t0,
        **{k: v for k, v in rmetrics.items() if k.endswith("/mean")},
    }
    print(f"eval on {result['tasks']} {c.env.name} validation tasks: success rate {result['success_rate']:.3f}, "
          f"mean reward {result['reward_mean']:.3f} ({result['seconds']:.1f}s)")
    if c.trainer.eval_output:
        Path(c.trainer.eval_output).parent.mkdir(parents=True, exist_ok=True)
        Path(c.trainer.eval_output).write_text(json.dumps(result, indent=2))
    return 0
