"""60-turn episodes train with ``memory=window`` under a 1024-token sample budget, through the real trainer (Ray,
two FSDP2 workers), with a chat template that drops earlier ``<think>`` blocks (issue #15)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_60_turn_relay_episodes_train_with_a_window_memory_and_exact_per_turn_log_probs(tmp_path, ray_local):
    from long_episode_run import main  # in this process, on the tests' shared Ray

    out = json.loads(json.dumps(main(str(tmp_path), [])))  # the summary the script prints, as it prints it
    print(f"long episodes: {out['episodes']}, {out['rows']} turn samples, longest {out['longest_sample_tokens']} "
          f"tokens, worker peak RSS {out['worker_peak_rss_mb']} MiB, max log-prob gap "
          f"{max(out['max_logprob_gap_per_row']):.2e}")
    episodes = out["episodes"]
    # No episode was cut by a token limit; the budget bounds each sample, not the episode.
    assert len(episodes) == 4 and all(e["termination"] != "truncated" for e in episodes)
    assert sum(e["turns"] == 60 for e in episodes) >= 2
    assert out["rows"] == sum(e["turns"] for e in episodes)
    assert out["longest_sample_tokens"] <= 1024
    m = out["metrics"]
    assert m["rollout/truncated"] == 0.0 and m["rollout/episodes"] == 4.0 and m["perf/samples"] == out["rows"]
    assert m["train/num_turns"] == pytest.approx(sum(e["turns"] for e in episodes) / 4)  # per episode, not per row
    # It trained: a policy-gradient step with a gradient, on turn samples whose advantages are not all 0.
    assert m["actor/num_updates"] == 1.0 and m["actor/grad_norm"] > 0 and m["train/advantages_abs_mean"] > 0
    # Each turn's logged engine log-probs equal the actor's recomputed ones, to float32 rounding: the engine
    # computes a context piecewise (its prefix cache keeps keys and values across turns, each decoded token is a
    # pass of its own), the actor in one pass over the row. A token out of place moves a log-prob by far more.
    assert len(out["max_logprob_gap_per_row"]) == out["rows"] and max(out["max_logprob_gap_per_row"]) <= 5e-5
    assert all(0 < mb < 8192 for mb in out["worker_peak_rss_mb"])
