"""The tiny default's tokenizer corpus: what the model will read and write."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openmanus_rl_core.process.alive import Alive
from openmanus_rl_core.rollout.env_pool import describe_error
from openmanus_rl_core.rollout.tasks import start_task


def tokenizer_corpus(env_factory: Callable[[], Any], template: Any, tasks: Sequence[Mapping[str, Any]],
                     max_turns: int = 8, progress: Alive | None = None) -> list[str]:
    """Texts for training the tiny default's tokenizer: what the model will read and write.

    For each task: the system prompt, the first observation, and, when the env has ``oracle_action`` (an
    ``OracleEnv``), the oracle episode's rendered replies (``template.render``) and observations. A task whose
    episode fails is skipped (the corpus is best effort), but an env that cannot be built fails at once (its
    factory would fail for every task: a server that cannot start must not be started once per task), and so does
    a corpus where every task failed (:class:`~openmanus_rl_core.plugin.envs.EnvUnavailableError`, naming the first error).
    The episodes skip a wrapper's simulated waits (:func:`~openmanus_rl_core.plugin.envs.undelayed`). ``progress`` is told
    of each task done. With a tool-calling template, the tools too, as its ``tool_prompt`` lists them.
    """
    from openmanus_rl_core.plugin.envs import EnvUnavailableError, undelayed

    env_factory = undelayed(env_factory)
    texts: list[str] = []
    started, first_error = 0, None
    for task in tasks:
        env = env_factory()
        try:
            first = start_task(env, task)  # the instruction may be the task's (a mix of envs: its source's)
            texts += [template.system_prompt(str(getattr(env, "instruction", "") or "")), first]
            tools = getattr(env, "tools", None) or getattr(template, "tools", None)
            if getattr(template, "calls_tools", False) and tools:  # the tools as a prompt lists them (rollout/chat.py)
                texts.append(template.tool_prompt(list(tools)))
            started += 1
            if not hasattr(env, "oracle_action"):
                continue
            for _ in range(max_turns):
                action = env.oracle_action()
                texts.append(template.render(action))
                res = env.step(action)
                texts.append(res.observation)
                if res.done:
                    break
        except Exception as exc:  # noqa: BLE001  (best effort: a failing task adds nothing more)
            first_error = first_error or exc
        finally:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass
            if progress is not None:
                progress.advance()
    if tasks and not started:
        raise EnvUnavailableError(f"no tokenizer corpus: every one of {len(tasks)} tasks failed to start; the first "
                                  f"error: {describe_error(first_error)}")
    return texts
