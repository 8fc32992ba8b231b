"""Benchmark: what RL adds over the field's supervised baselines, each given the same wall time (issue 45).

    python bench/rl_gain.py [--preset babyai_goto] [--seeds 0,1,2] [--demonstrator oracle] [--val-tasks 120]
                            [--methods sft,filtered_bc,self_imitation,grpo,opd] [--teacher auto|PATH]
                            [--ood OVERRIDE ...] [--json out.json] [--keep DIR] [hydra overrides ...]
                            [--rl OVERRIDE ...]

For each seed, runs of ``openmanus-rl train`` in fresh processes, all on ``+experiment=<preset> seed=<s>
warmup.demonstrator=<d>``:

- **the warm-up** (``trainer.total_steps=0``, saved): supervised learning on the demonstrator's episodes, successes
  and failures; validated. Its seconds ``W`` (``warmup/seconds``: playing the demonstrations and the steps).
- **grpo**, **self_imitation**, **opd**: each resumes a copy of the saved warm-up for the preset's RL steps, with
  the preset's algorithm, ``algorithm=self_imitation`` (sample ``algorithm.n`` per task, train on the successes:
  rejection-sampling fine-tuning, every step), or ``algorithm=opd algorithm.teacher.path=<teacher>`` (on-policy
  distillation). Their RL seconds ``R`` are the sum of the RL steps' ``timing/step``; each row's budget is ``W + R``.
- **filtered_grpo** (only when ``--methods`` names it): GRPO resumed from a second warm-up, on the successful
  demonstrations alone (``warmup.keep=success``); its budget is that warm-up's seconds ``W_f`` + its RL seconds.
- **sft**, **filtered_bc**: the warm-up alone from scratch with ``warmup.steps`` scaled by ``(W + R_grpo) / W``, so
  that they get the wall time of warm-up + GRPO; filtered_bc keeps the successful demonstrations only
  (``warmup.keep=success``). With filtered_grpo chosen, filtered_bc is its control instead: the filtered warm-up's
  steps scaled by ``(W_f + R_filtered_grpo) / W_f``, the filtered warm-up's own seconds per step.

The warm-up on all the demonstrations runs only when a chosen method needs it (``--methods
filtered_bc,filtered_grpo`` does not). ``--rl OVERRIDE ...`` go to the RL runs only (``--rl trainer.total_steps=60
actor.lr=2e-4``); put them after the other overrides, since ``--rl`` takes every word up to the next option.

opd's teacher (``--teacher auto``): the preset's warm-up on the oracle's demonstrations (same seed, so the same
tokenizer), exported with ``openmanus-rl export``; or an exported folder. Validation excluded on every side.

``--ood OVERRIDE ...``: the final checkpoint of every row is also scored with ``openmanus-rl eval`` under these
overrides (another BabyAI level, TextCraft's depth-2 goals), reported in its own column.

The table gives each row's greedy validation success on ``--val-tasks`` tasks with its 95% Wilson interval, its
seconds; the load average is printed before and after each run. ``--keep DIR`` keeps each run's folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUIET = ["trainer.progress=false", "trainer.val_before_train=false", "trainer.save_freq=0"]
METHODS = ("sft", "filtered_bc", "self_imitation", "grpo", "opd", "filtered_grpo")
DEFAULT = METHODS[:5]
RL = {"grpo": [], "self_imitation": ["algorithm=self_imitation"], "opd": ["algorithm=opd"], "filtered_grpo": ["warmup.keep=success"]}


def cli(args: list[str]) -> float:
    """One ``openmanus-rl`` command in a fresh process; its wall time."""
    cmd = [sys.executable, "-m", "openmanus_rl_core.cli", *args]
    print(f"  load {os.getloadavg()[0]:.1f}: {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    print(f"  load {os.getloadavg()[0]:.1f}: done in {wall:.0f}s", flush=True)
    return wall


def train(overrides: list[str], run_dir: Path) -> tuple[list[dict], float]:
    """One ``openmanus-rl train``: its metrics rows and its wall time. A run that finished in an earlier call with
    the same ``--keep`` folder is read, not run again."""
    done = run_dir / "bench_wall_s"
    if done.exists():
        print(f"  {run_dir.name}: finished before, read", flush=True)
        wall = float(done.read_text())
    else:
        wall = cli(["train", *QUIET, *overrides, f"trainer.run_dir={run_dir}"])
        done.write_text(f"{wall}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()], wall


def interval(rate: float, low: float, high: float) -> str:
    return f"{rate:.3f} [{low:.2f}, {high:.2f}]"


def val(row: dict, prefix: str) -> tuple[float, str]:
    return row[f"{prefix}/success_rate"], interval(*(row[f"{prefix}/success_{k}"] for k in ("rate", "ci_low",
                                                                                             "ci_high")))


def ood(run_dir: Path, overrides: list[str]) -> tuple[float, str]:
    """The run's last checkpoint scored by ``openmanus-rl eval`` under ``overrides``."""
    out = run_dir / "ood.json"
    if not out.exists():
        cli(["eval", f"trainer.checkpoint={run_dir}", f"trainer.eval_output={out}", *overrides])
    r = json.loads(out.read_text())
    return r["success_rate"], interval(r["success_rate"], r["success_ci_low"], r["success_ci_high"])


def teacher_folder(base: list[str], tmp: Path) -> str:
    """The oracle's warm-up (the preset's, same seed), exported: opd's teacher."""
    run = tmp / "teacher"
    rows, _ = train(base + ["warmup.demonstrator=oracle", "trainer.total_steps=0"], run)
    print(f"  teacher (oracle warm-up): {val(rows[0], 'warmup/val')[1]}", flush=True)
    if not (run / "hf").exists():
        cli(["export", f"trainer.checkpoint={run}", f"export.dir={run / 'hf'}"])
    return str(run / "hf")


def scaled_steps(steps: int, seconds: float, budget: float) -> int:
    """Warm-up steps that fill ``budget`` seconds at the rate of a warm-up that took ``seconds`` for ``steps``."""
    return round(steps * budget / seconds)


def needs_full_warmup(methods: list[str]) -> bool:
    """Whether a chosen method needs the warm-up on all the demonstrations: as the start of its RL, or for the
    seconds per step and the budget its steps are scaled by (filtered_bc has filtered_grpo's when that is chosen)."""
    return bool({"sft", "grpo", "self_imitation", "opd"} & set(methods)) or (
        "filtered_bc" in methods and "filtered_grpo" not in methods)


def one_seed(args: argparse.Namespace, seed: int, extra: list[str], tmp: Path) -> dict:
    base = [f"+experiment={args.preset}"] * bool(args.preset) + [f"seed={seed}", f"env.val_tasks={args.val_tasks}",
                                                                 *extra]
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: {unknown} unknown; choose from {', '.join(METHODS)}")
    demo = [f"warmup.demonstrator={args.demonstrator}"]
    out: dict = {"seed": seed, "rows": {}}
    warm, W, steps = tmp / f"warm_{seed}", None, None
    if needs_full_warmup(methods):
        rows, wall = train(base + demo + ["trainer.total_steps=0"], warm)
        first = rows[0]
        W, steps = first["warmup/seconds"], int(first["warmup/steps"])
        out.update(warmup_s=W, warmup_steps=steps, demo_success=first.get("warmup/demo_success"),
                   after_warmup=val(first, "warmup/val"))
    budget = {}
    for m in [m for m in ("grpo", "self_imitation", "opd", "filtered_grpo") if m in methods]:
        run = tmp / f"{m}_{seed}"
        start, W_m, steps_m = warm, W, steps
        if m == "filtered_grpo":  # GRPO after a warm-up on the successful demonstrations alone
            start = tmp / f"warm_success_{seed}"
            rows, _ = train(base + demo + ["trainer.total_steps=0", "warmup.keep=success"], start)
            W_m, steps_m = rows[0]["warmup/seconds"], int(rows[0]["warmup/steps"])
            out.update(filtered_warmup_s=W_m, filtered_warmup_steps=steps_m,
                       after_filtered_warmup=val(rows[0], "warmup/val"))
            out.setdefault("demo_success", rows[0].get("warmup/demo_success"))
        if not run.exists():
            shutil.copytree(start, run, ignore=shutil.ignore_patterns("bench_wall_s", "ood.json"))
        more = RL[m] + ([f"algorithm.teacher.path={args.teacher_path}"] if m == "opd" else [])
        rows, wall = train(base + demo + ["trainer.resume=auto", *more, *args.rl], run)
        R = sum(r["timing/step"] for r in rows if r["step"] > 0)
        budget[m] = W_m + R
        out["rows"][m] = {"val": val(rows[-1], "val"), "seconds": W_m + R,
                          "steps": f"{steps_m} + {rows[-1]['step']} RL", "run": run}
        out.setdefault("curves", {})[m] = [(r["step"], r["val/success_rate"]) for r in rows
                                           if r["step"] > 0 and "val/success_rate" in r]
    total = budget.get("grpo") or max(budget.values(), default=W)
    for m, keep in (("sft", "all"), ("filtered_bc", "success")):
        if m not in methods:
            continue
        run = tmp / f"{m}_{seed}"
        if m == "filtered_bc" and "filtered_grpo" in methods:  # filtered_grpo's control, at its rate and time
            sft_steps = scaled_steps(out["filtered_warmup_steps"], out["filtered_warmup_s"], budget["filtered_grpo"])
        else:
            sft_steps = scaled_steps(steps, W, total)
        rows, wall = train(base + demo + ["trainer.total_steps=0", f"warmup.steps={sft_steps}", f"warmup.keep={keep}"],
                           run)
        out["rows"][m] = {"val": val(rows[0], "warmup/val"), "seconds": rows[0]["warmup/seconds"],
                          "steps": f"{sft_steps} on {int(rows[0]['warmup/demonstrations'])} demos", "run": run}
    if args.ood:
        for m, row in out["rows"].items():
            row["ood"] = ood(row["run"], args.ood)
    for row in out["rows"].values():
        row["run"] = str(row["run"])
    return out


def table(results: list[dict], args: argparse.Namespace) -> None:
    print(f"\n{args.preset}, demonstrator {args.demonstrator}: greedy validation success on {args.val_tasks} tasks, "
          f"95% Wilson interval in brackets" + (f"; RL runs with {' '.join(args.rl)}" if args.rl else "") + "\n")
    ood_col = bool(args.ood)
    for r in results:
        print(f"seed {r['seed']}: demonstrator's own success {r['demo_success']:.3f}"
              + (f"; after the warm-up {r['after_warmup'][1]} ({r['warmup_steps']} steps, {r['warmup_s']:.0f} s)"
                 if "after_warmup" in r else "")
              + (f"; on the successes alone {r['after_filtered_warmup'][1]} ({r['filtered_warmup_steps']} steps, "
                 f"{r['filtered_warmup_s']:.0f} s)" if "after_filtered_warmup" in r else "")
              + "\n")
        print("| method | val success | seconds (warm-up + training) | steps |" + (" OOD success |" * ood_col))
        print("|---|---|---|---|" + "---|" * ood_col)
        for m in METHODS:
            if m in r["rows"]:
                row = r["rows"][m]
                print(f"| {m} | {row['val'][1]} | {row['seconds']:.0f} | {row['steps']} |"
                      + (f" {row['ood'][1]} |" if ood_col else ""))
        print()
        for m, curve in r.get("curves", {}).items():
            print(f"{m}, validation at RL steps " + " / ".join(str(step) for step, _ in curve) + ": "
                  + " / ".join(f"{v:.3f}" for _, v in curve))
        print()
    if len(results) > 1:
        print("| method | mean val success over seeds |\n|---|---|")
        for m in METHODS:
            vals = [r["rows"][m]["val"][0] for r in results if m in r["rows"]]
            if vals:
                print(f"| {m} | {statistics.mean(vals):.3f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="babyai_goto", help="an +experiment option ('': the embedded default)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--demonstrator", default="oracle", help="warmup.demonstrator: oracle or one the env offers")
    p.add_argument("--methods", default=",".join(DEFAULT), help=f"of {', '.join(METHODS)}")
    p.add_argument("--teacher", default="auto", help="opd's teacher: auto (the oracle's warm-up) or a model folder")
    p.add_argument("--ood", nargs="*", default=[], help="overrides of an out-of-distribution validation")
    p.add_argument("--val-tasks", type=int, default=120)
    p.add_argument("--json", default=None)
    p.add_argument("--keep", default=None, help="a folder that keeps each run's folder (default: a temporary one)")
    p.add_argument("--rl", nargs="*", default=[], help="overrides of the RL runs only (after every other override)")
    args, extra = p.parse_known_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(args.keep or tmp)
        runs.mkdir(parents=True, exist_ok=True)
        for seed in [int(s) for s in args.seeds.split(",")]:
            print(f"seed {seed}", flush=True)
            base = [f"+experiment={args.preset}"] * bool(args.preset) + [f"seed={seed}",
                                                                         f"env.val_tasks={args.val_tasks}", *extra]
            args.teacher_path = args.teacher
            if "opd" in args.methods.split(",") and args.teacher == "auto":
                args.teacher_path = teacher_folder(base, runs / f"seed_{seed}")
            results.append(one_seed(args, seed, extra, runs))
    table(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
