"""Rollout engines (``openmanus_rl.engines``): Hugging Face transformers (``hf``), vLLM (``vllm``) and a model served
behind an OpenAI-compatible API (``openai``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def check_prompts(prompts: Sequence[Sequence[int]], engine: str) -> None:
    """Every prompt must hold at least one token id: an empty one has no position to generate from."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError(f"{engine}.generate got an empty prompt; every prompt needs at least one token")


class EngineUnavailableError(RuntimeError):
    """The engine's model cannot be reached or did not answer usefully (a served model's server is down): the
    message names the URL and the reason; the command ends with it (exit 1)."""


def preflight(name: str, kwargs: Mapping[str, Any]) -> None:
    """Run the engine's own start-up check (a classmethod ``preflight(**kwargs)``, e.g. a served model's server must
    answer) before the command loads anything heavy; engines without one are checked when they are built."""
    from openmanus_rl_core.plugin.registry import registry

    check = getattr(registry("engine").get(name), "preflight", None)
    if check is not None:
        check(**kwargs)
