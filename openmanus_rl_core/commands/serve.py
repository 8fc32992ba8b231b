"""``openmanus-rl serve``: the gateway alone (gateway/server.py), in front of a checkpoint or a model folder.

For trying an agent by hand before training it, and for evaluating a policy through an agent's own harness. The
policy is loaded as ``eval`` loads it (a checkpoint's weights on its run's model folder, or ``model.path``); requests
are sampled as they ask (``temperature``, ``top_p``, ``max_tokens``), batched when they arrive together.
"""

from __future__ import annotations

import secrets
import signal
import threading
from typing import Any, Sequence

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import check
from openmanus_rl_core.run.setup import quiet_transformers, seed_all


def serve(cfg: Any, overrides: Sequence[str] = (), ready: Any = None) -> int:
    """Serve until SIGTERM or Ctrl-C; ``ready(gateway)`` is called once it listens (tests)."""
    import torch

    from openmanus_rl_core.commands.from_run import adopt_run_config, load_policy
    from openmanus_rl_core.gateway.server import Gateway, model_positions
    from openmanus_rl_core.gateway.tools import ChatRenderer
    from openmanus_rl_core.plugin.registry import build

    quiet_transformers()
    c, ckpt = adopt_run_config(check(cfg, training=False), overrides)
    seed_all(c.seed)
    policy = load_policy(c, ckpt)
    if policy is None:
        raise ConfigError("serve needs trainer.checkpoint=<checkpoint folder or run directory> or "
                          "model.path=<Hugging Face folder>")
    model, tokenizer, weights = policy
    device = "cuda" if torch.cuda.is_available() and c.trainer.device != "cpu" else "cpu"
    engine = build("engine", {"name": c.rollout.engine, "kwargs": c.rollout.engine_kwargs}, device=device,
                   seed=c.seed, model=model, tokenizer=tokenizer)
    if weights is not None:
        engine.update_weights(weights)
    key = c.serve.api_key or "omrl-" + secrets.token_hex(16)
    gateway = Gateway(engine, tokenizer, c.agent.model_name, host=c.serve.host, port=c.serve.port, keys=[key],
                      max_new_tokens=c.rollout.max_new_tokens, chat=ChatRenderer.for_agent(tokenizer, c.agent),
                      constrained=c.agent.constrained,
                      max_context_tokens=c.agent.max_context_tokens or model_positions(engine))
    done = threading.Event()
    previous = {s: signal.signal(s, lambda *_: done.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        print(f"serving {c.agent.model_name} at {gateway.base_url}\n  export OPENAI_BASE_URL={gateway.base_url}\n"
              f"  export OPENAI_API_KEY={key}\n  export OMRL_MODEL={c.agent.model_name}", flush=True)
        if ready is not None:
            ready(gateway)
        done.wait()
    finally:
        gateway.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    print("stopped serving", flush=True)
    return 0
