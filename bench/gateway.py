"""Benchmark: an agent of one's own through the gateway against the built-in agent loop.

    python bench/gateway.py parity [--seeds 0,1,2] [--agent function|command] [hydra overrides ...]
    python bench/gateway.py throughput [--episodes 64] [--repeats 3] [model overrides ...]
    python bench/gateway.py latency [--requests 200] [--repeats 3]
    python bench/gateway.py constrained [--repeats 3]

``parity``: for each seed, ``openmanus-rl train`` (the embedded default: key_door, the same warm-up, 60 GRPO steps)
twice, each in a fresh process: with the built-in loop, and with ``examples/key_door_agent.py`` behind the gateway
(``agent.function=examples.key_door_agent:play``, or ``--agent command``: a process per episode). Validation is on
the same 60 tasks, greedy. The table gives the final validation success of each and the difference.

``throughput``: the same engine (the tiny model after a short warm-up, exported) and the same env, ``--episodes``
key_door episodes at once, no training: the built-in loop's samples/s against the gateway's with the function agent
(``agent.max_concurrent`` = all of them), timed on a second batch of tasks after an untimed first one (the engine's
first calls). Each side runs in a fresh process, ``--repeats`` times; the median and the load average are
printed.

``latency``: what one request costs the gateway itself. An agent's sequential chat requests (``max_tokens=1``, one
keep-alive connection, the ``httpx`` client the ``openai`` SDK uses) to a gateway on the embedded default's size of
model, as in a training run (the one agent counted as running: the batcher waits for no other request), against
the engine's own ``generate`` of the same prompt for one token, in the same process; each
``--repeats`` run in a fresh process. The table gives the median milliseconds per request of each and their
difference, the gateway's HTTP, parsing, rendering and recording.

``constrained``: what a ``json_schema`` reply costs on ``hf`` against a free one of the same length, at the embedded
default and at 31M parameters: ``bench/constrained.py``, run as it is.
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

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["trainer.progress=false", "trainer.save_at_end=false", "trainer.save_freq=0"]
AGENTS = {"function": "agent.function=examples.key_door_agent:play",
          "command": f"agent.command={sys.executable} {ROOT / 'examples' / 'key_door_agent.py'}"}
# The built-in loop's template and reward for the agent too (an agent run would take reward=agent and
# template=message): the agent writes react tags, and parity compares the same reward.
AS_THE_LOOP = ["template=react", "reward=default"]


def train(overrides: list[str], run_dir: Path) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "openmanus_rl_core.cli", "train", *QUIET, *overrides, f"trainer.run_dir={run_dir}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the function agent imports examples.key_door_agent
    print(f"  load {os.getloadavg()[0]:.1f}: {' '.join(cmd[3:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    print(f"  load {os.getloadavg()[0]:.1f}: done in {wall:.0f}s", flush=True)
    return rows[-1], wall


def parity(seeds: list[int], agent: str, extra: list[str]) -> None:
    out = []
    with tempfile.TemporaryDirectory(prefix="omrl-gateway-") as tmp:
        for seed in seeds:
            loop, loop_s = train([f"seed={seed}", *extra], Path(tmp) / f"loop_{seed}")
            gw, gw_s = train([f"seed={seed}", AGENTS[agent], *AS_THE_LOOP, *extra], Path(tmp) / f"gateway_{seed}")
            out.append((seed, loop, loop_s, gw, gw_s))
            print(f"  seed {seed}: loop {loop['val/success_rate']:.3f}, gateway {gw['val/success_rate']:.3f}",
                  flush=True)  # kept in the log should a later seed fail
    print(f"\nparity ({agent} agent), load average {os.getloadavg()[0]:.1f}")
    print("| seed | built-in loop: val success | gateway: val success | difference | wall time (loop, gateway) |")
    print("|---|---|---|---|---|")
    for seed, loop, loop_s, gw, gw_s in out:
        a, b = loop["val/success_rate"], gw["val/success_rate"]
        print(f"| {seed} | {a:.3f} [{loop['val/success_ci_low']:.2f}, {loop['val/success_ci_high']:.2f}] | "
              f"{b:.3f} [{gw['val/success_ci_low']:.2f}, {gw['val/success_ci_high']:.2f}] | {b - a:+.3f} | "
              f"{loop_s:.0f}s, {gw_s:.0f}s |")
    a = statistics.mean(r[1]["val/success_rate"] for r in out)
    b = statistics.mean(r[3]["val/success_rate"] for r in out)
    print(f"| mean | {a:.3f} | {b:.3f} | {b - a:+.3f} | |")


def _engine_and_env(model_dir: str):
    from transformers import AutoModelForCausalLM

    from openmanus_rl_core.engines.hf import HFEngine
    from openmanus_rl_core.models.loading import load_tokenizer

    tok = load_tokenizer(model_dir, None)
    return HFEngine(AutoModelForCausalLM.from_pretrained(model_dir), tok, seed=0), tok


def one_side(side: str, model_dir: str, episodes: int) -> float:
    """Samples/s of one side, in this process."""
    import torch

    from openmanus_rl_core.config.agent import AgentConfig
    from openmanus_rl_core.gateway.rollout import AgentRollout
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.rollout import AgentLoop
    from openmanus_rl_core.config.schema import RolloutConfig

    torch.set_num_threads(1)
    engine, tok = _engine_and_env(model_dir)
    template = build("template", {"name": "react", "kwargs": {}})
    tasks = [{"task_id": i % 240, "seed": 0, "group_id": f"g{i // 8}"} for i in range(episodes)]
    rcfg = RolloutConfig(max_turns=4, max_new_tokens=64)
    if side == "loop":
        runner = AgentLoop(engine, tok, template, lambda: build("env", {"name": "key_door", "kwargs": {}}), rcfg)
    else:
        agent = AgentConfig(function="examples.key_door_agent:play", max_concurrent=episodes, timeout_s=300.0)
        runner = AgentRollout(engine, tok, template, agent, lambda: 0, rcfg.gen_wait_ms / 1000.0).sampling(rcfg)
    runner.run(tasks)  # untimed: the engine's first calls (allocations, kernels) are not what is compared
    tasks = [dict(t, task_id=(t["task_id"] + episodes) % 240) for t in tasks]
    t0 = time.perf_counter()
    eps = runner.run(tasks)
    seconds = time.perf_counter() - t0
    assert len(eps) == episodes and all(e.trajectory.termination != "env_error" for e in eps)
    return episodes / seconds


def throughput(episodes: int, repeats: int, overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="omrl-gateway-") as tmp:
        run = Path(tmp) / "warm"
        subprocess.run([sys.executable, "-m", "openmanus_rl_core.cli", "train", *QUIET, "trainer.total_steps=0",
                        "trainer.save_at_end=true", "trainer.val_before_train=false", f"trainer.run_dir={run}",
                        *overrides], check=True, capture_output=True, cwd=ROOT)
        model = Path(tmp) / "model"
        subprocess.run([sys.executable, "-m", "openmanus_rl_core.cli", "export", f"trainer.checkpoint={run}",
                        f"export.dir={model}"], check=True, capture_output=True, cwd=ROOT)
        rates: dict[str, list[float]] = {"loop": [], "gateway": []}
        for _ in range(repeats):
            for side in rates:
                env = dict(os.environ, PYTHONPATH=str(ROOT))
                out = subprocess.run([sys.executable, __file__, "one-side", side, str(model), str(episodes)],
                                     capture_output=True, text=True, env=env, cwd=ROOT)
                if out.returncode != 0:
                    raise SystemExit(f"{side} failed ({out.returncode}):\n{out.stderr[-3000:]}")
                rates[side].append(float(out.stdout.strip().splitlines()[-1]))
                print(f"  {side}: {rates[side][-1]:.1f} samples/s (load {os.getloadavg()[0]:.1f})", flush=True)
    loop, gw = statistics.median(rates["loop"]), statistics.median(rates["gateway"])
    print(f"\n{episodes} key_door episodes at once, median of {repeats}, load average {os.getloadavg()[0]:.1f}, "
          f"model: {' '.join(overrides) or 'the embedded default'}")
    print("| side | samples/s (median) | runs |")
    print("|---|---|---|")
    print(f"| built-in loop | {loop:.1f} | {', '.join(f'{r:.1f}' for r in rates['loop'])} |")
    print(f"| gateway, function agent | {gw:.1f} | {', '.join(f'{r:.1f}' for r in rates['gateway'])} |")
    print(f"| gateway / loop | {gw / loop:.2f} | |")


def latency_once(requests: int) -> dict:
    """Median ms of one request through the gateway and of the engine's generate alone, in this process."""
    import httpx
    import torch

    from openmanus_rl_core.engines.hf import HFEngine
    from openmanus_rl_core.gateway.server import Gateway
    from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
    from openmanus_rl_core.protocols import SamplingParams

    torch.set_num_threads(1)
    tok = build_tokenizer([f"room {i} has a key and a door; take key, open door" for i in range(200)], vocab_size=1024)
    model = build_tiny_model(tok, seed=0, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                             intermediate_size=256)
    engine = HFEngine(model, tok, seed=0, num_threads=1)
    gw = Gateway(engine, tok, "omrl-policy")
    body = {"model": "omrl-policy", "max_tokens": 1,
            "messages": [{"role": "user", "content": "You are in room 3. The door is locked. What do you do?"}]}
    try:
        key = gw.open_episode({"task_id": 0})
        gw.running.add(key)  # as in a run: its agent counted as running, so no request waits for company
        gateway_ms = []
        with httpx.Client(base_url=gw.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
            for i in range(requests + 10):  # the first 10 untimed
                t0 = time.perf_counter()
                assert client.post("/chat/completions", json=body).status_code == 200
                if i >= 10:
                    gateway_ms.append(1000 * (time.perf_counter() - t0))
        prompt = gw.close_episode(key).calls[0].prompt_ids  # what the engine was given
    finally:
        gw.close()
    engine_ms = []
    for i in range(requests + 10):
        t0 = time.perf_counter()
        engine.generate([prompt], SamplingParams(max_new_tokens=1))
        if i >= 10:
            engine_ms.append(1000 * (time.perf_counter() - t0))
    return {"gateway_ms": statistics.median(gateway_ms), "engine_ms": statistics.median(engine_ms)}


def latency(requests: int, repeats: int) -> None:
    runs = []
    for _ in range(repeats):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, __file__, "latency-once", str(requests)], check=True,
                             capture_output=True, text=True, env=env, cwd=ROOT)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  request {runs[-1]['gateway_ms']:.2f} ms, engine {runs[-1]['engine_ms']:.2f} ms "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    g = statistics.median(r["gateway_ms"] for r in runs)
    e = statistics.median(r["engine_ms"] for r in runs)
    print(f"\n{requests} sequential requests (max_tokens=1, one keep-alive connection), the embedded default's size, "
          f"median of {repeats} fresh processes, load average {os.getloadavg()[0]:.1f}")
    print("| ms per request: through the gateway | the engine's generate alone | the gateway's own |")
    print("|---|---|---|")
    print(f"| {g:.2f} | {e:.2f} | {g - e:.2f} |")


def main() -> None:
    if sys.argv[1:2] == ["latency-once"]:
        print(json.dumps(latency_once(int(sys.argv[2]))))
        return
    if sys.argv[1:2] == ["one-side"]:
        print(one_side(sys.argv[2], sys.argv[3], int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("parity")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--agent", default="function", choices=sorted(AGENTS))
    p.add_argument("overrides", nargs="*")
    t = sub.add_parser("throughput")
    t.add_argument("--episodes", type=int, default=64)
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("overrides", nargs="*", help="the model's settings, e.g. model.tiny.hidden_size=256")
    lat = sub.add_parser("latency")
    lat.add_argument("--requests", type=int, default=200)
    lat.add_argument("--repeats", type=int, default=3)
    c = sub.add_parser("constrained")
    c.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.what == "constrained":
        subprocess.run([sys.executable, str(Path(__file__).with_name("constrained.py")), "--repeats",
                        str(args.repeats)], check=True)
    elif args.what == "latency":
        latency(args.requests, args.repeats)
    elif args.what == "parity":
        parity([int(s) for s in args.seeds.split(",")], args.agent, args.overrides)
    else:
        throughput(args.episodes, args.repeats, args.overrides)


if __name__ == "__main__":
    main()
