"""The agent of ``env=verifiers`` (``agent.function=openmanus_rl_env_verifiers.agent:play``): one verifiers episode
per trainer episode, played by the policy at the gateway.

:func:`play` takes the task row's verifiers taskset (``verifiers_id`` and ``verifiers_settings``, the columns
``VerifiersEnv.task_fields`` wrote) and its row ``task_id``, and runs ``Env.run_episode`` on it with verifiers' own
machinery: its interception server on 127.0.0.1 records the trace and forwards each call to the gateway, the
in-process harness (``omrl_verifiers_harness``) makes the calls, the taskset's rubric scores the trace. verifiers
reads an endpoint's API key from an environment variable only, so the episode's key travels in a variable of its
own (``OMRL_VERIFIERS_KEY_<hex>``), set for the episode and removed after it.

Each episode builds its own ``Env`` (cheap: the taskset's rows are loaded once per process) and serves it for its
own length: ``Env.serving()`` keeps its interception on the ``Env`` object, so two episodes must not share one.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Mapping

from openmanus_rl_env_verifiers import spec

__all__ = ["play", "VerifiersEpisodeError"]


class VerifiersEpisodeError(RuntimeError):
    """The verifiers episode failed (its harness, its rubric, the model calls): the trainer's episode is an
    ``env_error``."""


async def play(client: Any, task: Mapping[str, Any], model: str) -> float:
    """Run the task row's verifiers episode against ``client`` (the gateway, the episode's key); return its
    reward (the traces' rewards, averaged over the traces of a multi-seat episode)."""
    import verifiers.v1 as vf

    env_id, settings = task.get("verifiers_id"), task.get("verifiers_settings")
    if not env_id or not settings:
        raise VerifiersEpisodeError("the task row has no verifiers_id / verifiers_settings columns: run with the "
                                    "task files env=verifiers writes (data.train_files=null, or `openmanus-rl data "
                                    "make env=verifiers env.kwargs.id=...`)")
    rows = spec.rows(str(env_id), str(settings))
    row = rows[int(task.get("task_id") or 0) % len(rows)]
    expected = task.get("verifiers_task")
    if expected is not None and str(row.data.id) != str(expected):
        raise VerifiersEpisodeError(f"task {task.get('task_id')}: the taskset {env_id} loads row {row.data.id!r} "
                                    f"here, the task file says {expected!r}; its load() order must not change")
    var = f"OMRL_VERIFIERS_KEY_{uuid.uuid4().hex}"
    os.environ[var] = client.api_key
    try:
        env = vf.load_environment(spec.env_config(str(env_id), str(settings)))
        ctx = vf.ModelContext(model=model, client=vf.EvalClientConfig(base_url=str(client.base_url).rstrip("/"),
                                                                      api_key_var=var))
        async with env.serving():
            episode = await env.run_episode(row, ctx)
    finally:
        os.environ.pop(var, None)
    errors = [e.message for e in episode.errors]
    errors += [t.last_error.message for t in episode.traces if getattr(t, "last_error", None) is not None]
    if not episode.ok or not episode.traces:
        reason = "; ".join(dict.fromkeys(m.strip() for m in errors if m and m.strip())) or "no trace"
        raise VerifiersEpisodeError(f"the verifiers episode of {env_id} task {task.get('task_id')} failed: "
                                    f"{reason}")
    return sum(t.reward for t in episode.traces) / len(episode.traces)
