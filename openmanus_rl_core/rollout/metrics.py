"""Scalars over a rollout (success, turns, terminations, lengths, throughput)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from openmanus_rl_core.protocols import TERMINATIONS, Trajectory
from openmanus_rl_core.rollout.episode import Episode


def rollout_metrics(episodes: Sequence[Episode], elapsed_s: float | None = None) -> dict[str, float]:
    """Scalars over a rollout: ``rollout/success_rate``, ``rollout/turns/mean``, ``rollout/termination/<reason>``
    (counts), ``rollout/response_length/{mean,max}``, ``rollout/agent_tokens/mean``, ``rollout/truncated``
    (fraction), ``rollout/env_reward/mean``, ``rollout/forced_tokens`` (the share of generated tokens a constraint
    forced, when some were: ``rollout.constrain_actions``) and throughput (``rollout/episodes_per_s``,
    ``rollout/turns_per_s``, ``rollout/tokens_per_s`` over generated tokens) when the elapsed time is known
    (``elapsed_s`` or the ``rollout_time_s`` the loop stores in each trajectory's info). With a model-written
    memory summary (rollout/summaries.py): ``rollout/summary_tokens/{mean,max}`` over the summaries written,
    ``rollout/summary_writes``, ``rollout/summary_fallbacks`` and ``rollout/summary_cut`` (counts). With an agent
    behind the gateway: ``gateway/continuous_episodes`` (one sample each) and ``gateway/segmented_episodes`` (split
    at a break in their history: one sample per segment), ``gateway/segments/{mean,max}`` per episode and
    ``gateway/bridged_calls`` (calls continued from the recorded tokens where the chat template re-renders history).
    """
    n = len(episodes)
    if n == 0:
        return {}
    trajs = [e.trajectory for e in episodes]
    turns = sum(t.num_turns for t in trajs)
    agent_tokens = sum(sum(e.response_mask) for e in episodes)
    out: dict[str, float] = {
        "rollout/episodes": float(n),
        "rollout/success_rate": sum(bool(t.success) for t in trajs) / n,
        "rollout/turns/mean": turns / n,
        "rollout/response_length/mean": sum(len(e.response_ids) for e in episodes) / n,
        "rollout/response_length/max": float(max(len(e.response_ids) for e in episodes)),
        "rollout/prompt_length/mean": sum(len(e.prompt_ids) for e in episodes) / n,
        "rollout/agent_tokens/mean": agent_tokens / n,
        "rollout/truncated": sum(e.truncated for e in episodes) / n,
        "rollout/env_reward/mean": sum(t.env_reward for t in trajs) / n,
    }
    forced = sum(len(e.forced) for e in episodes)
    if forced:  # rollout.constrain_actions: the share of generated tokens the grammar allowed alone
        out["rollout/forced_tokens"] = forced / max(agent_tokens, 1)
    counts = Counter(t.termination for t in trajs)
    for reason in TERMINATIONS:
        out[f"rollout/termination/{reason}"] = float(counts.get(reason, 0))
    for reason, c in counts.items():
        out[f"rollout/termination/{reason}"] = float(c)
    gateway = [t.info for t in trajs if "gateway" in t.info]
    if gateway:  # an agent behind the gateway: how its calls became samples (gateway/episodes.py)
        joined = Counter(info["gateway"] for info in gateway)
        out["gateway/continuous_episodes"] = float(joined.get("continuous", 0))
        out["gateway/segmented_episodes"] = float(len(gateway) - joined.get("continuous", 0))
        parts = [info["gateway_segments"] for info in gateway]
        out["gateway/segments/mean"] = sum(parts) / len(parts)
        out["gateway/segments/max"] = float(max(parts))
        out["gateway/bridged_calls"] = float(sum(info["gateway_bridged"] for info in gateway))
    written = [n for t in trajs for n in t.info.get("summary_tokens", ())]
    if written:
        out["rollout/summary_writes"] = float(len(written))
        out["rollout/summary_tokens/mean"] = sum(written) / len(written)
        out["rollout/summary_tokens/max"] = float(max(written))
        out["rollout/summary_fallbacks"] = float(sum(t.info.get("summary_fallbacks", 0) for t in trajs))
        out["rollout/summary_cut"] = float(sum(t.info.get("summary_cut", 0) for t in trajs))
    if elapsed_s is None:
        times = [t.info.get("rollout_time_s") for t in trajs if t.info.get("rollout_time_s")]
        elapsed_s = max(times) if times else None
    if elapsed_s:
        out["rollout/time_s"] = float(elapsed_s)
        out["rollout/episodes_per_s"] = n / elapsed_s
        out["rollout/turns_per_s"] = turns / elapsed_s
        out["rollout/tokens_per_s"] = agent_tokens / elapsed_s
    return out



def source_metrics(prefix: str, trajectories: Sequence[Trajectory], totals: Sequence[float]) -> dict[str, float]:
    """Per source of a mix of envs (each task row's ``source``): ``<prefix>/<source>/reward_mean``,
    ``success_rate``, ``num_turns`` and ``episodes``; nothing when no task names a source."""
    by_source: dict[str, list[tuple[Trajectory, float]]] = {}
    for trajectory, total in zip(trajectories, totals):
        source = trajectory.task.get("source")
        if source is not None:
            by_source.setdefault(str(source), []).append((trajectory, float(total)))
    out: dict[str, float] = {}
    for source, rows in sorted(by_source.items()):
        n = len(rows)
        out[f"{prefix}/{source}/episodes"] = float(n)
        out[f"{prefix}/{source}/reward_mean"] = sum(total for _, total in rows) / n
        out[f"{prefix}/{source}/success_rate"] = sum(bool(t.success) for t, _ in rows) / n
        out[f"{prefix}/{source}/num_turns"] = sum(t.num_turns for t, _ in rows) / n
    return out
