"""Benchmark: lockstep rollout against episodes on their own and the bounded-staleness group stream.

    python bench/async.py [--repeats 3] [--steps 6] [--rows a,b,o,c,d,e,D] [--json out.json] [hydra overrides ...]

First the embedded default's model is warmed up once on key_door's demonstrations (the default 120 supervised
steps, so replies and episode lengths are those of a learning policy) and exported. Every row is then ``openmanus-rl train`` of that
folder in a fresh process (``actor.lr`` as the tiny model's recipe), behind the ``latency`` env (key_door, each
step waiting a seeded lognormal time: median 50 ms, sigma 1.2), 16 tasks x 8 samples = 128 episodes per step, no
validation. Rows:

- (a) ``rollout.mode=lockstep``: today's loop, each turn waits for its slowest env call;
- (b) ``rollout.mode=episodes``: each episode moves on when its own env call returns; still on-policy (eta 0);
- (b') ``rollout.max_staleness=0 rollout.overlap_update=true`` (row key ``o``): episodes on their own in the stream
  at eta 0, and the policy gradient of each complete group computed while the rest of the batch plays; still
  on-policy, the same update as (b);
- (c)-(e) ``rollout.max_staleness=1, 2, 4``: the group stream, rollouts keep running while the trainer updates;
- (d') ``rollout.max_staleness=2 rollout.stale_policy=drop`` (row key ``D``): (d), but a group that would be trained
  staler than eta is thrown away instead of waited for.

Columns, over steps 2..N of each run (step 1 fills the stream and pays one-time costs), median over the repeats:

- samples/s: trained episodes per second of step wall time;
- s/step: the median step time;
- rollout-wait share: the share of the step the trainer spends waiting for episodes (``timing/rollout`` /
  ``timing/step``: for (a) and (b) the whole rollout, env waits included; for the stream only the wait for
  the batch's last groups);
- staleness: the mean staleness of the trained samples (``stream/staleness_mean``, 0 without the stream);
- dropped: groups thrown away as too stale per step (``rollout/groups_dropped``, the stream only);
- turns trained / generated: the mean turns of the trained episodes against those of every episode the stream
  completed (``stream/trained_turns``, ``stream/generated_turns``): a drop that favours short episodes shows here;
- generate s: the stream's seconds inside the engine's ``generate`` per step, both ranks summed
  (``timing/generate``; only the stream logs it, so (a) and (b) show ``-``).

The machine's load average is printed before and after each row; take numbers on a quiet machine.

    python bench/async.py --learning [--seeds 0,1,2] [--steps 20] [--rows a,b,d]

Learning is not hurt: each row trains ``--steps`` RL steps from the same warmed-up model for each seed, then
validates greedily on the 60 validation tasks; the first table gives the final success per seed and its mean, the
second the throughput columns above, median over the seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROWS = {
    "a": ("(a) lockstep", ["rollout.mode=lockstep"]),
    "b": ("(b) episodes, eta=0", ["rollout.mode=episodes"]),
    "o": ("(b') episodes, eta=0, update overlapped", ["rollout.max_staleness=0", "rollout.overlap_update=true"]),
    "c": ("(c) stream, eta=1", ["rollout.max_staleness=1"]),
    "d": ("(d) stream, eta=2", ["rollout.max_staleness=2"]),
    "e": ("(e) stream, eta=4", ["rollout.max_staleness=4"]),
    "D": ("(d') stream, eta=2, stale groups dropped", ["rollout.max_staleness=2", "rollout.stale_policy=drop"]),
}
QUIET = ["trainer.val_freq=0", "trainer.val_before_train=false", "trainer.val_at_end=false", "trainer.progress=false",
         "trainer.save_freq=0"]
COMMON = ["env=latency", "data.train_batch_size=16", "rollout.n=8", "actor.lr=0.0005", *QUIET]


def cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "openmanus_rl_core.cli", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc


def warmed_model(tmp: Path) -> Path:
    """The embedded default's model after the default warm-up on key_door, as a Hugging Face folder."""
    run = tmp / "warm-run"
    cli("train", "env=key_door", "warmup.validate=false", "trainer.total_steps=1",
        f"trainer.run_dir={run}", *QUIET)
    cli("export", f"trainer.checkpoint={run}", f"export.dir={tmp / 'warm'}")
    return tmp / "warm"


def summarize(rows: list[dict]) -> dict:
    """Throughput over steps 2..N of one run's metrics rows (step 1 fills the stream and pays one-time costs)."""
    steps_rows = [r for r in rows if r.get("step", 0) >= 2 and "timing/step" in r]
    step_s = [r["timing/step"] for r in steps_rows]
    gen = [r["timing/generate"] for r in steps_rows if "timing/generate" in r]
    episodes = [r.get("stream/groups", 16) * 8 for r in steps_rows]
    return {
        "samples_per_s": sum(episodes) / sum(step_s),
        "step_s": statistics.median(step_s),
        "wait_share": statistics.median(r["timing/rollout"] / r["timing/step"] for r in steps_rows),
        "staleness": statistics.mean(r.get("stream/staleness_mean", 0.0) for r in steps_rows),
        "generate_s": statistics.median(gen) if gen else None,
        "dropped": statistics.mean(r.get("rollout/groups_dropped", 0.0) for r in steps_rows),
        "turns": _turns(steps_rows),
    }


def _turns(rows: list[dict]) -> tuple[float, float] | None:
    """Mean turns of the trained episodes and of every episode the stream completed (None without the stream)."""
    if not all("stream/trained_turns" in r for r in rows):
        return None
    generated = [r["stream/generated_turns"] for r in rows if r["stream/generated_turns"] > 0]  # 0: none completed
    return (statistics.mean(r["stream/trained_turns"] for r in rows), statistics.mean(generated)) if generated else None


def throughput_table(results: dict[str, list[dict]], first: str) -> None:
    base = statistics.median(r["samples_per_s"] for r in results[first])
    print("\n| row | samples/s | vs first row | s/step | rollout-wait share | staleness | dropped/step | "
          "turns trained / generated | generate s | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("samples_per_s", "step_s", "wait_share",
                                                                   "staleness")}
        gen = [r["generate_s"] for r in runs if r["generate_s"] is not None]
        loads = f"{min(r['load'][0] for r in runs):.1f}-{max(r['load'][1] for r in runs):.1f}"
        turns = [r["turns"] for r in runs if r["turns"]]
        turns_s = (f"{statistics.median(t[0] for t in turns):.2f} / {statistics.median(t[1] for t in turns):.2f}"
                   if turns else "-")
        dropped = statistics.median(r["dropped"] for r in runs)
        print(f"| {ROWS[key][0]} | {med['samples_per_s']:.1f} | {med['samples_per_s'] / base:.2f}x | "
              f"{med['step_s']:.2f} | {med['wait_share']:.2f} | {med['staleness']:.2f} | {dropped:.2f} | {turns_s} | "
              f"{f'{statistics.median(gen):.2f}' if gen else '-'} | {loads} |")


def run_dir(tmp: str, key: str, i: int) -> Path:
    """A run's output folder, named by the row's index: keys d and D differ only in case."""
    return Path(tmp) / f"{list(ROWS).index(key)}-{i}"


def run_row(overrides: list[str], steps: int, out_dir: Path) -> dict:
    load_before = os.getloadavg()[0]
    cli("train", *COMMON, f"trainer.total_steps={steps}", f"trainer.output_dir={out_dir}", *overrides)
    rows = [json.loads(x) for x in next(out_dir.rglob("metrics.jsonl")).read_text().splitlines() if x.strip()]
    return {**summarize(rows), "rows": rows, "load": (load_before, os.getloadavg()[0])}


def learning(rows: list[str], seeds: list[int], steps: int, model: str | None, extra: list[str]) -> None:
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = model or warmed_model(Path(tmp))
        for seed in seeds:
            for key in rows:
                r = run_row([f"model.path={model}", f"seed={seed}", "trainer.val_at_end=true", *ROWS[key][1],
                             *extra], steps, run_dir(tmp, key, seed))
                r["final"] = [x for x in r.pop("rows") if "val/success_rate" in x][-1]["val/success_rate"]
                results.setdefault(key, []).append(r)
                print(f"{ROWS[key][0]} seed {seed}: final val success {r['final']:.3f}, "
                      f"{r['samples_per_s']:.1f} samples/s, load {r['load'][0]:.1f} -> {r['load'][1]:.1f}",
                      flush=True)
    base = statistics.mean(r["final"] for r in results[rows[0]])
    print("\n| row | final val success per seed | mean | vs first row |")
    print("|---|---|---|---|")
    for key, runs in results.items():
        mean = statistics.mean(r["final"] for r in runs)
        finals = ", ".join(f"{r['final']:.3f}" for r in runs)
        print(f"| {ROWS[key][0]} | {finals} | {mean:.3f} | {mean - base:+.3f} |")
    throughput_table(results, rows[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="RL steps per run (6; --learning: 20)")
    p.add_argument("--rows", default=None, help="rows to run (a,b,o,c,d,e,D; --learning: a,b,d)")
    p.add_argument("--learning", action="store_true", help="final validation success over seeds instead")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--model", default=None, help="a warmed-up model folder to start from (default: made anew)")
    p.add_argument("--json", default=None)
    args, extra = p.parse_known_args()
    if args.learning:
        return learning((args.rows or "a,b,d").split(","), [int(s) for s in args.seeds.split(",")],
                        args.steps or 20, args.model, extra)
    args.rows, args.steps = args.rows or "a,b,o,c,d,e", args.steps or 6
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        extra = [f"model.path={args.model or warmed_model(Path(tmp))}", *extra]
        for rep in range(args.repeats):  # rows interleaved: a slow minute hurts every row alike
            for key in args.rows.split(","):
                name, overrides = ROWS[key]
                r = run_row([*overrides, *extra], args.steps, run_dir(tmp, key, rep))
                r.pop("rows")
                results.setdefault(key, []).append(r)
                print(f"{name} run {rep + 1}: {r['samples_per_s']:.1f} samples/s, {r['step_s']:.2f} s/step, "
                      f"load {r['load'][0]:.1f} -> {r['load'][1]:.1f}", flush=True)
    throughput_table(results, args.rows.split(",")[0])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
