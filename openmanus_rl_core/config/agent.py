"""The ``agent`` section: your own agent behind the gateway (a section of :class:`~.schema.Config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from openmanus_rl_core.config.fields import opt


@dataclass
class AgentConfig:
    """Your own agent, run once per episode against the gateway (docs/gateway.md): the policy served at an
    OpenAI-compatible endpoint that records every token. Off while neither ``command`` nor ``function`` is set."""

    command: Optional[str] = opt(None, "a program run once per episode (shell words); it gets OPENAI_BASE_URL, "
                                       "OPENAI_API_KEY, OMRL_MODEL and OMRL_TASK in its environment")
    function: Optional[str] = opt(None, "pkg.mod:fn, an async fn(client, task) -> reward | None run once per "
                                        "episode (client: openai.AsyncOpenAI on the gateway)")
    max_concurrent: int = opt(64, "agents running at once, per actor worker", ge=1)
    timeout_s: float = opt(300.0, "an agent still running after this is killed; its episode is dropped", gt=0)
    model_name: str = opt("omrl-policy", "the policy's name at /v1/models (the agent gets it as OMRL_MODEL)")
    tool_parser: Optional[str] = opt(None, "how the model writes tool calls (gateway/parsers.py); null: found from "
                                           "the chat template", choices=("hermes", "qwen3_coder", "llama3_json",
                                                                         "mistral", "mistral_args", "deepseek_v3",
                                                                         "deepseek_v31", "harmony"))
    reasoning_parser: Optional[str] = opt(None, "how the model writes its reasoning (think: <think>...</think>, "
                                                "harmony: gpt-oss's analysis channel, none); null: found from the "
                                                "chat template", choices=("think", "harmony", "none"))
    reward_option: str = opt("agent", "the reward option (reward=...) an agent run takes when nothing chose one: "
                                      "the reward the agent posts")
    template_option: str = opt("message", "the template option (template=...) an agent run takes when nothing "
                                          "chose one: every reply its framework writes a valid action, no format "
                                          "penalty")
    constrained: bool = opt(True, "honour a request's tool_choice (required, a named function) and response_format "
                                  "/ text.format (json_object, json_schema) by grammar-constrained decoding")
    max_context_tokens: Optional[int] = opt(None, "the longest context an agent's request may fill (prompt and "
                                                  "reply); a longer prompt gets OpenAI's 400 "
                                                  "context_length_exceeded (null: the model's positions)", ge=2)
