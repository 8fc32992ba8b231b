"""The plugin contract: every type a plugin author implements or receives, in one module.

A plugin author reads only this file. It imports nothing heavy (no torch), so a plugin that only
implements an environment or a template never pulls the training stack in.

Kinds and their entry-point groups (the entry-point name is the name a config selects):

=============  ============================  =====================================================
kind           entry-point group             the value (``module:attr``)
=============  ============================  =====================================================
env            ``openmanus_rl.envs``         an :class:`Env` class or factory ``(**kwargs) -> Env``
reward         ``openmanus_rl.rewards``      a :class:`RewardComponent` class, or a function
                                             ``compute_score(solution_str, ground_truth, **kw)``
template       ``openmanus_rl.templates``    an :class:`ActionTemplate` class
allocator      ``openmanus_rl.allocators``   an :class:`Allocator` class or function
advantage      ``openmanus_rl.advantages``   ``estimator(batch, **cfg) -> (advantages, returns)``, or a class
                                             whose instance (one a run) is that; its ``state_dict()`` and
                                             ``load_state_dict(state)``, if it has them, ride in the checkpoint;
                                             ``reads_turn_rewards = True``: it reads ``step_rewards``, so the KL
                                             reward penalty (on tokens) is refused with it;
                                             ``values_choices = True``: with
                                             ``algorithm.all_action_coeff`` it writes the batch's
                                             ``choice_values``
loss           ``openmanus_rl.losses``       ``loss(old_logprob, logprob, advantages, mask, **cfg)``
engine         ``openmanus_rl.engines``      a :class:`RolloutEngine` class
memory         ``openmanus_rl.memories``     a :class:`Memory` class
=============  ============================  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

__all__ = [
    "StepResult",
    "Env",
    "OracleEnv",
    "ParsedAction",
    "ActionTemplate",
    "Turn",
    "Trajectory",
    "RewardComponent",
    "Allocator",
    "Constraint",
    "SamplingParams",
    "Generation",
    "RolloutEngine",
    "Memory",
    "PastTurn",
    "Summary",
    "SummaryRequest",
    "TERMINATIONS",
    "as_text",
]


# ----------------------------------------------------------------------------------------------- env
def as_text(value: Any) -> str:
    """Whatever a model reply or an action arrived as, as a str, never raising: bytes are decoded leniently
    (invalid UTF-8 replaced), ``None`` is ``""``, other objects go through ``str`` (a hostile ``__str__`` gives
    ``""``). Envs and templates call it first, so that any input is an unknown action, never a crash."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    try:
        return "" if value is None else str(value)
    except Exception:  # noqa: BLE001
        return ""


@dataclass
class StepResult:
    """What one :meth:`Env.step` returns.

    ``reward`` is this step's reward (not cumulative). ``info`` may carry ``success`` (bool) and
    ``score`` (float); anything else is passed through to the trajectory for logging.
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """A text environment. It may block (an HTTP call); the rollout runs many of them concurrently.

    Optional attributes the core uses when present:

    - ``instruction: str`` -- describes the task family and the action syntax; templates put it in the
      system prompt.
    - ``num_tasks: int`` -- how many distinct task ids exist (``openmanus-rl data make`` uses it).
    - ``start_task(task: Mapping) -> str`` -- start a task from its whole row, before anything else is tried (a mix
      of envs, ``env=mix``, picks the row's source); ``instruction`` is then read for that task.
    - ``reset_from_observation(observation: str) -> str`` -- start the task whose first observation is the given
      text (a task given by content: a dataset row's ``observation``, e.g. the first user turn of an OpenManus-RL
      demonstration). The rollout calls it instead of ``reset`` when the task row has an ``observation``.
    - ``serve(**kwargs) -> EnvService`` on the env's entry point (class or factory), for envs behind servers (a
      ``serve`` that declares ``at_once`` is told the most episodes the command plays at once, one that declares
      ``run_dir`` the training run's folder): see
      :mod:`openmanus_rl_core.plugin.envs`.
    - ``check_run(kwargs, cfg) -> None`` on the env's entry point: rules across config sections, checked with a
      training run's config before anything starts (``kwargs``: ``env.kwargs``; ``cfg``: the typed config); a ``ValueError`` whose
      message starts with the key it names is the one-line error (e.g. ``rollout.mode=lockstep: ...``).
    - ``tools: list[dict]`` -- the env's tools as OpenAI function schemas (``{"type": "function", "function":
      {"name", "description", "parameters"}}``). With a tool-calling template (``ActionTemplate.calls_tools``) the
      prompt is rendered with ``tokenizer.apply_chat_template(..., tools=tools)`` and ``step`` receives a call as the
      canonical text ``{"name": ..., "arguments": {...}}`` (``json.dumps`` with its default separators; see the
      template plugin's ``tool_calls`` module).
    - ``action_choices() -> list[str] | None`` -- the actions ``step`` accepts now, as texts (a game's legal moves),
      or None when the env does not know. With ``rollout.constrain_actions=true`` the next reply is decoded as
      ``template.render(choice)`` for one of them (:mod:`openmanus_rl_core.rollout.choices`).
    - ``without_delays() -> Env`` -- the same episodes without simulated waits (a wrapper that only delays, such
      as ``latency``, gives the env it wraps). Work off the rollout path plays that env instead: the tokenizer
      corpus and the warm-up's oracle episodes (:func:`openmanus_rl_core.plugin.envs.undelayed`).
    """

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        """Start an episode and return the first observation.

        The same ``(task_id, seed)`` must give the same initial state: group-based estimators compare
        several samples of one task.
        """

    def step(self, action: str) -> StepResult:
        """Apply one action (the content the template parsed out of the model's reply).

        Any text may arrive here; an action the env does not understand is answered with an
        observation saying so (and ``info["invalid"] = True``), never with an exception.
        """

    def close(self) -> None:
        """Release the env's resources. Called once, also after an error."""


@runtime_checkable
class OracleEnv(Env, Protocol):
    """An env that knows a correct next action: used for tests and the supervised warm-up."""

    def oracle_action(self) -> str:
        """The action an expert takes in the current state (before :meth:`Env.step`)."""


# ------------------------------------------------------------------------------------------ template
@dataclass
class ParsedAction:
    """A model reply as the template understood it.

    ``kind`` is the template's word for what was found (``"action"``, ``"answer"``, ``"tool_call"``)
    or ``"invalid"``; ``content`` is what goes to :meth:`Env.step` (for an invalid reply: the raw
    text, so the env can answer it). ``thought`` is the reasoning part, if the template has one.
    """

    kind: str
    content: str
    valid: bool
    thought: str = ""


@runtime_checkable
class ActionTemplate(Protocol):
    """How the model is asked to act, and how its replies are read.

    Attribute ``stop: list[str]`` -- strings that end a reply (the engine stops generating there,
    keeping the stop string).

    Optional attribute ``end_pattern: str | None`` -- the regular expression a well-formed reply ends with, stop
    string included (``re.search`` on the whole reply; e.g. ``</action>\\s*$``): the ``format`` reward scores a
    reply that parses as valid and matches it, so a reply that runs on after its action earns nothing. Absent or
    None: every valid reply counts. Set it, or ``format`` cannot tell a tidy reply from a rambling one.

    Optional, for a tool-calling template: ``calls_tools = True`` makes the rollout show the model the env's
    ``tools`` (:class:`Env`), else the template's own ``tools: list[dict] | None``, through the chat template; a chat
    template that does not write tools gets ``tool_prompt(tools) -> str`` after the system prompt instead
    (``rollout/chat.py``: ``prompt_tools``).
    """

    stop: list[str]

    def system_prompt(self, instruction: str) -> str:
        """The system message for a task family, given the env's ``instruction`` (may be empty)."""

    def parse(self, text: str) -> ParsedAction:
        """Read a model reply. Never raises: an unparseable reply is ``ParsedAction(valid=False)``."""

    def render(self, action: str, thought: str = "") -> str:
        """A well-formed reply that carries ``action`` (demonstrations for the warm-up and tests).

        ``parse(render(a)).content == a`` for every action ``a`` the env accepts.
        """


# -------------------------------------------------------------------------------------- trajectory
TERMINATIONS = ("done", "max_turns", "truncated", "env_error", "invalid")
"""Why an episode ended: the env said done; the turn limit; a token limit; the env failed; the
rollout gave up on a model that produced nothing usable."""


@dataclass
class Turn:
    """One model reply and the env's answer to it.

    ``span`` is ``[start, end)`` of the reply's tokens within the trajectory's response tokens
    (the part after the prompt), so allocators can place rewards on exactly those tokens.
    """

    response: str
    action: ParsedAction
    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    span: tuple[int, int] = (0, 0)


@dataclass
class Trajectory:
    """One episode, as reward components and allocators see it.

    ``task`` carries the task's own row (e.g. ``ground_truth``, ``data_source``) for scorers.
    ``response_length`` is the number of response tokens (agent and observation tokens).
    """

    task_id: int | None
    seed: int | None
    group_id: Any
    initial_observation: str
    turns: list[Turn] = field(default_factory=list)
    success: bool | None = None
    termination: str = "done"
    error: str | None = None
    response_length: int = 0
    task: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def env_reward(self) -> float:
        """Sum of the env's per-step rewards."""
        return float(sum(t.reward for t in self.turns))

    @property
    def final_response(self) -> str:
        """The last model reply (single-turn scorers read this)."""
        return self.turns[-1].response if self.turns else ""

    @property
    def segments(self) -> list[tuple[int, int]]:
        """``[start, end)`` token spans of the agent's replies, one per turn."""
        return [t.span for t in self.turns]


# ------------------------------------------------------------------------------------------ reward
@runtime_checkable
class RewardComponent(Protocol):
    """One reward signal. The composer sums ``weight * compute(trajectory)`` over components.

    Optional: ``compute_turns(trajectory) -> list[float]`` (one value per turn, summing to what
    ``compute`` returns) for process rewards; the ``per_turn`` allocator then puts each turn's
    value on that turn's tokens. Without it, the whole value counts for the last turn.

    ``compute`` may also return a dict ``{"score": float, **extra_metrics}``.

    Optional: ``use_template(template: ActionTemplate) -> None``, called once after the component is built with
    the run's template, for a component that judges replies by the template's rules (``format`` reads its
    ``end_pattern``).
    """

    def compute(self, trajectory: Trajectory) -> float:
        """The component's unweighted value for one trajectory."""


# --------------------------------------------------------------------------------------- allocator
@runtime_checkable
class Allocator(Protocol):
    """Places a trajectory's reward on its response tokens.

    ``reward`` is the composed total; ``turn_rewards`` splits it per turn (same sum); ``segments``
    are the agent tokens' ``[start, end)`` spans in the response, one per turn; ``length`` is the
    response length. Returns ``length`` floats; non-agent positions must be 0.
    """

    def __call__(
        self,
        reward: float,
        turn_rewards: Sequence[float],
        segments: Sequence[tuple[int, int]],
        length: int,
    ) -> list[float]: ...


# ------------------------------------------------------------------------------------------ engine
@dataclass
class Constraint:
    """What a reply must be, for grammar-constrained decoding: exactly one of

    - ``json_schema``: one JSON value valid against this schema (a dict), written compactly with ``json.dumps``'s
      default separators (``", "`` and ``": "``, no other whitespace);
    - ``lark``: text matching this Lark grammar, in the dialect of the llguidance library (``%json {schema}``
      embeds a JSON schema, written as above; see ``engines/constrained.py``, which also builds tool-call grammars).

    The reply ends (EOS) only where the grammar allows it. ``name`` says what it is, for messages and logs.
    Engines draw each token from the model's distribution masked to the tokens the grammar allows, renormalised,
    and record that distribution's log-probability.
    """

    json_schema: dict[str, Any] | None = None
    lark: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if (self.json_schema is None) == (self.lark is None):
            raise ValueError(f"a Constraint takes exactly one of json_schema and lark, got json_schema="
                             f"{self.json_schema!r}, lark={self.lark!r}")
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise ValueError(f"Constraint.json_schema must be a dict (a JSON schema), not {self.json_schema!r}")


@dataclass
class SamplingParams:
    """How an engine samples. ``stop`` strings end a reply (kept in the output).

    ``constraint``: None (free text); one :class:`Constraint` for every prompt of the call; or a list with one
    ``Constraint | None`` per prompt (rows of one batch may differ).
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    greedy: bool = False
    constraint: Constraint | list[Constraint | None] | None = None


@dataclass
class Generation:
    """One sampled reply: its token ids and their log-probabilities under the sampling policy.

    ``finish_reason`` is ``"stop"`` (a stop string or EOS) or ``"length"``.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates replies for a batch of token-id prompts in ONE call."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One generation per prompt, in order."""

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Load the actor's new weights in memory (no round trip through disk)."""

    # Optional (not part of the runtime check): ``sleep()`` frees the engine's accelerator memory while the
    # colocated actor trains, ``wake_up()`` takes it back; ``generate`` and ``update_weights`` wake the engine by
    # themselves. The actor worker calls ``sleep()`` after every rollout when the engine has it
    # (``rollout.sleep_after_rollout``). ``reset_prefix_cache()`` forgets what earlier calls cached; the agent loop
    # calls it when a rollout starts, so a rollout's samples never depend on an earlier one (engines/prefix_cache.py).
    # Optional class attributes: ``trainable = False`` makes ``train`` refuse the engine (one line, exit 2);
    # ``needs_model = False`` makes ``rollout`` and ``eval`` build it with the run's ``tokenizer`` only (no ``model``,
    # no weights loaded): an engine whose model is served elsewhere (``openai``).


# ------------------------------------------------------------------------------------------ memory
@dataclass
class PastTurn:
    """One finished turn as a :class:`Memory` sees it: the model's ``reply`` (text as generated), the ``action``
    the template parsed out of it, and the ``observation`` the env answered with (cut to the rollout's
    ``max_obs_tokens`` as the model would see it)."""

    reply: str
    action: str
    observation: str


@dataclass
class Summary:
    """A model-written summary of an episode's earliest turns: ``text`` covers ``history[:turns]``."""

    text: str = ""
    turns: int = 0


@dataclass
class SummaryRequest:
    """What a memory asks a writer model: the chat to answer, and how many turns (``history[:turns]``) the answer
    will summarise."""

    messages: list[dict[str, str]]
    turns: int


@runtime_checkable
class Memory(Protocol):
    """Decides what context the model sees at each turn.

    ``per_turn = False`` (the ``full`` memory): the loop concatenates the whole episode token for token (one
    training sample per episode); ``messages`` then only describes that context. ``per_turn = True``: before each
    reply the loop renders ``messages(...)`` with the tokenizer's chat template (generation prompt added); that
    context is the prompt of the turn's own training sample, cut to the rollout's per-sample token budget
    (oldest past turns dropped first).

    Optional (not part of the runtime check), for a per-turn memory whose context holds a model-written summary:

    - ``summary_tokens: int``: the summary's budget in the run's tokens; absent or 0, the loop never asks for one;
    - ``summary_engine(tokenizer) -> RolloutEngine | None``: the engine that writes (built once, by the memory);
      None: the rollout's own engine, i.e. the policy;
    - ``summary_request(system, task, history, summary) -> SummaryRequest | None``: before a reply, the chat a
      writer answers to bring ``summary`` (a :class:`Summary`, empty at first) up to date; None: it is;
    - ``summary_fallback(turns) -> str``: the summary of ``turns`` kept when the writer's reply is unusable (no
      letter or digit: empty, blank, punctuation only), e.g. a rule-written one;
    - ``messages(system, task, history, summary=...)`` then receives the episode's :class:`Summary`.

    The loop asks for every episode about to generate in one batched ``generate`` (``max_new_tokens`` = the
    budget, no stop strings), cuts the text to the budget by tokens, and never trains on it
    (``rollout/summaries.py``).
    """

    per_turn: bool

    def messages(self, system: str, task: str, history: Sequence[PastTurn]) -> list[dict[str, str]]:
        """The chat (``[{"role": "system" | "user" | "assistant", "content": str}, ...]``, ending with a user
        message) for the next reply: ``system`` is the template's system prompt, ``task`` the first observation,
        ``history`` every finished turn so far, oldest first (its last observation is the current one)."""
