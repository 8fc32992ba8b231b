"""Benchmark: samples per second of one GRPO training step, ours against TRL's ``GRPOTrainer``.

    python bench/trainer.py [--prompts 8] [--group 8] [--completion-len 64] [--warmup 1] [--steps 4]
                            [--threads 1,0] [--only trl,ours,inprocess] [--json out.json] [hydra overrides ...]

What is measured (one invocation, one machine, the implementations one after the other, each in its own fresh
Python process so that none inherits another's threads, process group or allocator state):

- model: the embedded default -- the tiny Qwen2 the schema's ``model.tiny`` describes, with the tokenizer trained
  on the env's oracle episodes, exactly as ``openmanus-rl train`` builds it -- saved once to a folder that every
  implementation loads (same weights, same tokenizer);
- data: the env's generated training tasks (default ``env=word_copy``, single turn). Each task's prompt is what our
  agent loop sends: the template's system prompt and the env's first observation in the tokenizer's chat template
  (TRL gets that same text, which tokenises to the same ids);
- per step: ``--prompts`` tasks x ``--group`` samples (the GRPO group), at most ``--completion-len`` new tokens,
  temperature 1, top-p 1, no top-k. Completions end at EOS on both sides (and, in our agent loop, at the template's
  stop string); the table reports the mean completion length each side actually generated, from the same
  untrained model;
- reward: ours, the configured reward composer; TRL, the env's own reward for the parsed action (a function of
  microseconds on either side);
- update: GRPO advantages normalised by the group std, PPO-clip loss (``clip_low``/``clip_high`` from the config;
  TRL ``epsilon``/``epsilon_high``) averaged over tokens (TRL ``loss_type="dapo"``), no KL (TRL ``beta=0``), one
  optimizer step per step, on-policy (no separate old-log-prob pass on either side), AdamW, grad clip, float32.

Rows:

- ``TRL GRPOTrainer``: ``trl.GRPOTrainer`` (transformers ``generate``), one process, once per ``--threads`` count.
- ``ours (trainer)``: :meth:`openmanus_rl_core.run.trainer.Trainer.train_step`, as ``openmanus-rl train`` runs it: Ray,
  ``trainer.num_workers`` FSDP2 actor workers (``trainer.torch_threads`` threads each), rollout through the agent
  loop with real env ``reset``/``step`` calls, reward composer, allocator, advantage estimator, update, weight sync.
- ``ours (1 rank, no Ray)``: the same worker code in-process -- one :class:`~openmanus_rl_core.workers.ActorWorker`
  (FSDP2 over a gloo group of one) with the same thread count as TRL, generating straight from the prompt ids with
  its ``HFEngine``: our step without the Ray / agent-loop overhead. Once per ``--threads`` count.

Threads matter more than anything else here: on a machine whose other processes already use the cores, torch's
OpenMP threads spin-wait on each other and a multi-threaded tiny-model step gets many times slower, while
one-thread processes are barely affected. So the single-process rows run at each ``--threads`` count (default: 1
and torch's default, i.e. all cores), and the table prints the machine's load average before and after.

A step's wall time is taken with ``time.perf_counter`` around the whole step (generation, reward, advantages,
update, weight sync); the first ``--warmup`` steps are dropped. The trainer row also prints each timed step and
the median of each phase (its ``timing/*`` metrics). samples/s = prompts x group / mean step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


# ------------------------------------------------------------------------------------------------ set-up
def _overrides(args: argparse.Namespace) -> list[str]:
    """Hydra overrides shared by every side: the env, group size, batch, lengths, a single turn."""
    return list(args.overrides) + [
        f"rollout.n={args.group}",
        f"data.train_batch_size={args.prompts}",
        f"rollout.max_new_tokens={args.completion_len}",
        "rollout.max_turns=1",
        f"seed={args.seed}",
    ]


def build_inputs(args: argparse.Namespace, work: Path) -> dict:
    """Build the model folder and the task prompts every implementation uses; returns the spec the children read."""
    from transformers import AutoTokenizer

    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.data.tasks import load_tasks
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.data.generation import ensure_task_files
    from openmanus_rl_core.run.warmup import build_corpus

    overrides = _overrides(args)
    cfg = load(overrides)
    train_file, _ = ensure_task_files(cfg, work / "data")
    tasks = load_tasks(train_file)
    template = build("template", cfg.template)

    model_dir = work / "model"
    if cfg.model.path:
        model_dir = Path(cfg.model.path)
    else:
        corpus = build_corpus(lambda: build("env", cfg.env), template, tasks, 1)
        load_model_and_tokenizer(cfg.model, corpus, save_dir=model_dir)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, padding_side="left")

    prompts = []
    for t in tasks:
        env = build("env", cfg.env)
        try:
            obs = env.reset(task_id=t["task_id"], seed=t["seed"])
            system = template.system_prompt(str(getattr(env, "instruction", "") or ""))
        finally:
            env.close()
        text = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": obs}],
                                       tokenize=False, add_generation_prompt=True)
        prompts.append({"prompt": text, "task_id": int(t["task_id"]), "seed": int(t["seed"])})
    return {"model_dir": str(model_dir), "overrides": overrides + [f"data.train_files={train_file}"],
            "prompts": prompts, "args": {k: v for k, v in vars(args).items() if k != "child"}}


def env_reward(spec_overrides: list[str]):
    """``reward(text, task_id, seed) -> float``: the env's reward for the action the template parses from ``text``."""
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.plugin.registry import build

    cfg = load(spec_overrides)
    template = build("template", cfg.template)

    def reward(text: str, task_id: int, seed: int) -> float:
        env = build("env", cfg.env)
        try:
            env.reset(task_id=task_id, seed=seed)
            return float(env.step(template.parse(text).content).reward)
        finally:
            env.close()

    return reward


# ------------------------------------------------------------------------------------------------ TRL
def run_trl(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from openmanus_rl_core.config.loading import load

    a = spec["args"]
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    cfg = load(spec["overrides"])
    loss_cfg = cfg.algorithm.loss_cfg
    tok = AutoTokenizer.from_pretrained(spec["model_dir"], local_files_only=True, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], local_files_only=True, dtype=torch.float32)
    score = env_reward(spec["overrides"])
    B, G = a["prompts"], a["group"]

    def reward(completions, task_id, seed, **_):
        return [score(c, t, s) for c, t, s in zip(completions, task_id, seed)]

    step_times: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_times.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            max_steps=a["warmup"] + a["steps"],
            per_device_train_batch_size=B * G,  # completions per optimizer step: B prompts x G samples
            gradient_accumulation_steps=1,
            num_generations=G,
            max_completion_length=a["completion_len"],
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            num_iterations=1,
            epsilon=float(loss_cfg["clip_low"]),
            epsilon_high=float(loss_cfg["clip_high"]),
            loss_type="dapo",
            scale_rewards="group",
            learning_rate=float(cfg.actor.lr),
            lr_scheduler_type="constant",
            max_grad_norm=float(cfg.actor.grad_clip),
            bf16=False,
            fp16=False,
            use_cpu=a["device"] == "cpu",
            seed=a["seed"],
            dataloader_num_workers=0,
            log_completions=False,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, processing_class=tok,
                              train_dataset=Dataset.from_list(spec["prompts"]), callbacks=[Clock()])
        trainer.train()
    return {"impl": "TRL GRPOTrainer", "step_times": step_times,
            "completion_len": statistics.mean(lengths[a["warmup"]:] or lengths) if lengths else float("nan"),
            "setup": f"1 process, {torch.get_num_threads()} thread(s)"}


# ------------------------------------------------------------------------------------------------ ours
def run_ours(spec: dict) -> dict:
    """Our GRPO step as ``openmanus-rl train`` runs it: :meth:`Trainer.train_step` (Ray, FSDP2 worker group)."""
    from openmanus_rl_core.config.loading import compose
    from openmanus_rl_core.run.trainer import Trainer

    a = spec["args"]
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose(spec["overrides"] + [
            f"model.save_dir={spec['model_dir']}", f"trainer.run_dir={run_dir}",
            f"trainer.total_steps={a['warmup'] + a['steps']}", "trainer.val_before_train=false", "trainer.val_freq=0",
            "trainer.val_at_end=false", "trainer.save_freq=0", "trainer.save_at_end=false", "trainer.loggers=[]",
            "trainer.progress=false", "warmup.enabled=false", f"trainer.device={a['device']}",
        ])
        trainer = Trainer(cfg)
        try:
            trainer.setup()
            trainer.skipped_steps = 0  # fit() sets it; train_step counts into it
            times, lengths, timings = [], [], []
            for step in range(1, a["warmup"] + a["steps"] + 1):
                t0 = time.perf_counter()
                m = trainer.train_step(step)
                times.append(time.perf_counter() - t0)
                lengths.append(m["train/response_length"])
                timings.append({k.removeprefix("timing/"): v for k, v in m.items() if k.startswith("timing/")})
            workers, threads = int(cfg.trainer.num_workers), int(cfg.trainer.torch_threads)
            sharding = str(trainer.actor.setup_info[0].get("sharding", "full")).split(" ")[0]
        finally:
            trainer.shutdown()
    timed = timings[a["warmup"]:]
    phases = {k: statistics.median(t[k] for t in timed) for k in timed[0] if k != "step"}
    return {"impl": "ours (trainer)", "step_times": times, "completion_len": statistics.mean(lengths[a["warmup"]:]),
            "setup": f"Ray, {workers} workers ({sharding}) x {threads} thread(s)", "phases": phases}


class InProcessGRPO:
    """Our GRPO step on one in-process actor rank: the worker code without Ray and without the agent loop."""

    def __init__(self, spec: dict):
        import torch

        from openmanus_rl_core.config.loading import load
        from openmanus_rl_core.workers import ActorWorker

        a = spec["args"]
        self.a = a
        if spec.get("threads"):
            torch.set_num_threads(int(spec["threads"]))
        cfg = load(spec["overrides"] + [f"trainer.torch_threads={torch.get_num_threads()}",
                                        f"trainer.device={a['device']}"])
        self.worker = ActorWorker(cfg, rank=0, world_size=1, model_dir=spec["model_dir"],
                                  total_steps=a["warmup"] + a["steps"])
        self.worker.setup(*self.worker.free_address())
        self.tok = self.worker.tokenizer
        self.rows = [dict(p, ids=self.tok(p["prompt"], add_special_tokens=False)["input_ids"]) for p in spec["prompts"]]
        self.score = env_reward(spec["overrides"])
        self.threads = torch.get_num_threads()

    def step(self, step: int) -> float:
        """One GRPO step on ``prompts`` tasks (cycling through the task list); returns the mean completion length."""
        import torch

        from openmanus_rl_core.algorithms.advantages import grpo_sequence_advantages
        from openmanus_rl_core.batch import Batch
        from openmanus_rl_core.protocols import SamplingParams

        B, G = self.a["prompts"], self.a["group"]
        start = ((step - 1) * B) % len(self.rows)
        tasks = [self.rows[(start + i) % len(self.rows)] for i in range(B)]
        rows = [t for t in tasks for _ in range(G)]
        gens = self.worker.engine.generate([r["ids"] for r in rows], SamplingParams(
            max_new_tokens=self.a["completion_len"], temperature=1.0, top_p=1.0, top_k=0))
        scores = torch.tensor([self.score(g.text, r["task_id"], r["seed"]) for g, r in zip(gens, rows)])
        adv = grpo_sequence_advantages(scores, [i // G for i in range(len(rows))])

        pad = self.worker.engine.pad_token_id
        N, P, R = len(rows), max(len(r["ids"]) for r in rows), max(len(g.token_ids) for g in gens)
        input_ids = torch.full((N, P + R), pad, dtype=torch.long)
        attn = torch.zeros((N, P + R), dtype=torch.long)
        responses = torch.full((N, R), pad, dtype=torch.long)
        mask = torch.zeros((N, R), dtype=torch.float32)
        for i, (r, g) in enumerate(zip(rows, gens)):
            p, n = r["ids"], len(g.token_ids)
            input_ids[i, P - len(p):P] = torch.tensor(p)
            attn[i, P - len(p):P + n] = 1
            input_ids[i, P:P + n] = torch.tensor(g.token_ids)
            responses[i, :n] = torch.tensor(g.token_ids)
            mask[i, :n] = 1
        batch = Batch(tensors={
            "input_ids": input_ids, "attention_mask": attn, "position_ids": (attn.cumsum(-1) - 1).clamp_min(0),
            "responses": responses, "response_mask": mask, "advantages": adv.unsqueeze(-1) * mask,
        })
        self.worker.update(batch, step)
        self.worker.sync_rollout_weights()
        return float(mask.sum(-1).mean())


def run_inprocess(spec: dict) -> dict:
    a = spec["args"]
    state = InProcessGRPO(spec)
    times, lengths = [], []
    try:
        for step in range(1, a["warmup"] + a["steps"] + 1):
            t0 = time.perf_counter()
            lengths.append(state.step(step))
            times.append(time.perf_counter() - t0)
    finally:
        state.worker.shutdown()
    return {"impl": "ours (1 rank, no Ray)", "step_times": times, "completion_len": statistics.mean(lengths[a["warmup"]:]),
            "setup": f"1 process, {state.threads} thread(s)"}


RUNNERS = {"trl": run_trl, "ours": run_ours, "inprocess": run_inprocess}


# ------------------------------------------------------------------------------------------------ driver
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=8, help="tasks per step")
    p.add_argument("--group", type=int, default=8, help="samples per task (GRPO group size)")
    p.add_argument("--completion-len", type=int, default=64, help="max new tokens per sample")
    p.add_argument("--warmup", type=int, default=1, help="steps run first and not counted")
    p.add_argument("--steps", type=int, default=4, help="timed steps")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", default="1,0",
                   help="torch thread counts of the single-process rows (TRL, 1 rank), comma-separated; each gets "
                        "its own row; 0 = torch's default (all cores)")
    p.add_argument("--only", default="trl,ours,inprocess", help="comma-separated subset of trl, ours, inprocess")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--update-batches", default="",
                   help="instead of the step table: the update on per-turn-sample batches of these envs (comma-"
                        "separated: relay, babyai; bench/update_batch.py)")
    p.add_argument("--ub-episodes", type=int, default=2, help="--update-batches: episodes per env")
    p.add_argument("--ub-turns", type=int, default=50, help="--update-batches: turns per episode")
    p.add_argument("--ub-rows", type=int, default=8, help="--update-batches: rows per micro-batch before")
    p.add_argument("--ub-repeats", type=int, default=3, help="--update-batches: timed updates per side")
    p.add_argument("--child", nargs=3, metavar=("IMPL", "SPEC", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. env=word_copy model.tiny.hidden_size=128")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        job, spec_path, out = args.child
        impl, _, threads = job.partition(":")
        spec = json.loads(Path(spec_path).read_text())
        spec["threads"] = int(threads or 0)
        result = RUNNERS[impl](spec)
        Path(out).write_text(json.dumps(result))
        return 0
    if args.update_batches:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import update_batch

        rows = update_batch.run([e.strip() for e in args.update_batches.split(",") if e.strip()], args)
        update_batch.print_table(rows, args)
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "update_batches": rows}, indent=2))
        return 0
    impls = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in impls if s not in RUNNERS]
    if unknown:
        print(f"--only: unknown {unknown}; choose from {sorted(RUNNERS)}", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    thread_counts = [int(t) for t in str(args.threads).split(",") if t.strip()] or [0]
    # Single-process rows run once per thread count; the trainer row uses its own config (trainer.torch_threads).
    jobs = [f"{i}:{t}" for i in impls for t in (thread_counts if i in ("trl", "inprocess") else [0])]
    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        work = Path(tmp)
        spec = build_inputs(args, work)
        (work / "spec.json").write_text(json.dumps(spec))
        for job in jobs:
            out = work / f"{job.replace(':', '-')}.json"
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", job, str(work / "spec.json"),
                                   str(out)], capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{job}: failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}",
                      file=sys.stderr)
                return 1
            r = json.loads(out.read_text())
            r["process_s"] = time.perf_counter() - t0
            results.append(r)

    samples = args.prompts * args.group
    load_after = os.getloadavg()
    print(f"GRPO training step, {args.device}: {args.prompts} tasks x {args.group} samples = {samples} samples/step, "
          f"prompts {min(len(p['prompt']) for p in spec['prompts'])}-{max(len(p['prompt']) for p in spec['prompts'])} "
          f"chars, <= {args.completion_len} new tokens; {args.warmup} warm-up + {args.steps} timed steps; "
          f"overrides: {' '.join(args.overrides) or '(none: the embedded default)'}")
    header = (f"{'implementation':<24} {'s/step':>8} {'min s':>7} {'samples/s':>10} {'gen tok/s':>10} "
              f"{'compl. len':>10}  setup")
    print(f"machine: {os.cpu_count()} CPUs; 1-minute load average {load_before[0]:.1f} before, {load_after[0]:.1f} "
          f"after (other processes compete for the cores when it exceeds the CPU count)")
    print(header)
    print("-" * (len(header) + 24))
    rows = []
    for r in results:
        timed = r["step_times"][args.warmup:]
        mean = statistics.mean(timed)
        row = {**r, "mean_step_s": mean, "min_step_s": min(timed), "samples_per_s": samples / mean,
               "completion_tokens_per_s": samples * r["completion_len"] / mean}
        rows.append(row)
        print(f"{row['impl']:<24} {mean:>8.3f} {row['min_step_s']:>7.3f} {row['samples_per_s']:>10.2f} "
              f"{row['completion_tokens_per_s']:>10.0f} {row['completion_len']:>10.1f}  {row['setup']}")
    for r in rows:
        if r.get("phases"):
            print(f"{r['impl']}: timed steps {', '.join(f'{t:.2f}' for t in r['step_times'][args.warmup:])} s; "
                  f"median phase s: {', '.join(f'{k} {v:.3f}' for k, v in r['phases'].items())}")
    trls = [r for r in rows if r["impl"].startswith("TRL")]
    if trls:
        best = max(trls, key=lambda r: r["samples_per_s"])
        for r in rows:
            if r not in trls:
                print(f"{r['impl']} ({r['setup']}) / fastest TRL ({best['setup']}): "
                      f"{r['samples_per_s'] / best['samples_per_s']:.2f}x samples per second")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
