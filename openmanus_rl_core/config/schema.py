"""The typed configuration: one dataclass per section, the single source of every default.

Hydra composes ``configs/config.yaml`` on top of :class:`Config` (registered in Hydra's ConfigStore as
``schema``), so a YAML file only chooses options (``env=key_door``) and overrides values; a key the schema does
not know, or a value of the wrong type, fails the composition. :func:`openmanus_rl_core.config.loading.load` then checks
ranges and the cross-field rules (:data:`openmanus_rl_core.config.rules.RULES`) before anything starts.

Plugin-owned parts stay open mappings, checked by the plugin when :func:`openmanus_rl_core.plugin.registry.build`
builds it: ``env.kwargs``, ``template.kwargs``, ``allocator.kwargs``, ``reward.components.<label>.kwargs``,
``algorithm.loss_cfg`` (the policy loss's options) and ``rollout.engine_kwargs``.

A field's ``metadata``: ``help`` (one line for ``docs/configuration.md``), and optional ``ge`` / ``gt`` (lower
bounds) and ``choices``; ``None`` always passes a bound (a field that may be null says what null means);
``commands``: the only commands that read the key (``openmanus-rl train trainer.checkpoint=...`` is refused).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from openmanus_rl_core.config.agent import AgentConfig
from openmanus_rl_core.config.commands import ExportConfig, ReplayConfig, ServeConfig
from openmanus_rl_core.config.fields import FROM_CHECKPOINT, ROLLOUT, opt


# -------------------------------------------------------------------------------------------- plugin choices
@dataclass
class EnvConfig:
    """The environment (group ``env``: each option is a plugin's ``env/<name>.yaml``)."""

    name: str = opt(MISSING, "env plugin name (registry `openmanus_rl.envs`)")
    kwargs: Dict[str, Any] = opt({}, "constructor arguments of the env (checked by the env plugin)")
    max_turns: int = opt(MISSING, "model replies per episode", ge=1)
    train_tasks: int = opt(256, "training tasks a generated split holds (`data make` and data.train_files=null)",
                           ge=1)
    val_tasks: int = opt(64, "validation tasks a generated split holds", ge=0)
    num_tasks: Optional[int] = opt(None, "task ids the env has; generated ids wrap around it (null: ask the env)",
                                   ge=1)


@dataclass
class NamedComponentConfig:
    """A component built by name from its registry, with free-form kwargs the plugin checks."""

    name: str = opt(MISSING, "component name in its registry (`openmanus-rl plugins <kind>` lists them)")
    kwargs: Dict[str, Any] = opt({}, "constructor arguments (checked by the plugin)")


@dataclass
class MemoryConfig:
    """What context the model sees at each turn (group ``memory``: full, window, summary; registry
    ``openmanus_rl.memories``). Any memory but ``full`` makes one training sample per turn."""

    name: str = opt(MISSING, "memory plugin name (registry `openmanus_rl.memories`)")
    window: int = opt(4, "window / summary: the last K turns shown verbatim after the task", ge=1)
    kwargs: Dict[str, Any] = opt({}, "constructor arguments of the memory (checked by the memory plugin)")


@dataclass
class RewardConfig:
    """The reward (group ``reward``): weighted components, summed."""

    components: Dict[str, Any] = opt({}, "label -> {name: reward plugin, weight: 1.0, kwargs: {...}} (checked by "
                                         "the reward composer; name defaults to the label)")
    on_error: str = opt("raise", "a component that fails on every sample of a training step: raise (the run stops, "
                                 "exit 1, naming it) | warn (a console line, the run goes on); a partial failure "
                                 "is a console line per step either way", choices=("raise", "warn"),
                        commands=("train",))
    missing_callables: str = opt("refuse", "a resume or eval of a run that had rewards given as Python callables, "
                                           "without them given again: refuse (one line naming them) | drop (go "
                                           "on without them)", choices=("refuse", "drop"), commands=("train", "eval"))


# -------------------------------------------------------------------------------------------------- algorithm
@dataclass
class KLControlConfig:
    type: str = opt("fixed", "KL coefficient controller", choices=("fixed", "adaptive"))
    kl_coef: float = opt(0.001, "initial KL reward-penalty coefficient", ge=0)
    target_kl: float = opt(0.1, "adaptive: the KL the coefficient steers towards", gt=0)
    horizon: int = opt(10000, "adaptive: samples over which the coefficient adapts", ge=1)


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling: a group whose samples all score the same trains nothing (zero advantage); it is
    dropped and another group is sampled in its place."""

    enabled: bool = opt(False, "drop groups with no spread in `metric`, and sample others in their place")
    metric: str = opt("reward", "what must vary within a group: reward (the composed total) or success",
                      choices=("reward", "success"))
    max_extra_groups: Optional[int] = opt(None, "most groups sampled in one step to replace dropped ones (null: "
                                                "data.train_batch_size); past it the step trains on fewer", ge=0)


@dataclass
class TeacherConfig:
    path: Optional[str] = opt(None, "algorithm=opd: the teacher, a model folder with the policy's tokenizer; it is "
                                    "the reference policy, whose log-probs on the policy's samples teach it")


@dataclass
class AlgorithmConfig:
    """Advantages, policy loss and KL (group ``algorithm``: grpo, ppo, gigpo)."""

    adv_estimator: str = opt("grpo", "advantage estimator (registry `openmanus_rl.advantages`)")
    n: int = opt(8, "group size: samples per task (rollout.n follows it)", ge=1)
    norm_by_std: bool = opt(True, "grpo/gigpo: divide by the group's reward std")
    epsilon: float = opt(1.0e-6, "grpo/gigpo: added to the std", gt=0)
    step_weight: float = opt(1.0, "gigpo: weight of the step-level advantage")
    gamma: float = opt(1.0, "discount (gae, reinforce_plus_plus, gigpo steps, state_baseline, value_table)", ge=0)
    lam: float = opt(1.0, "gae and value_table: lambda", ge=0)
    value_window: int = opt(64, "value_table: a state's value: the mean of its last ~N returns (step 1/min(visits, N))", ge=1)
    use_critic: bool = opt(False, "train a value model (CriticWorker); needs an estimator that uses values")
    policy_loss: str = opt("ppo_clip", "policy loss (registry `openmanus_rl.losses`)")
    loss_cfg: Dict[str, Any] = opt({"clip_low": 0.2, "clip_high": 0.28, "clip_c": None, "agg_mode": "token-mean"},
                                   "options of the policy loss (checked by the loss); agg_mode also aggregates "
                                   "entropy, KL and the value loss")
    entropy_coeff: float = opt(0.0, "entropy bonus coefficient", ge=0)
    choice_kl_coeff: float = opt(0.0, "add this times KL(reference || policy), exact over the tokens a constraint "
                                 "allowed (rollout.constrain_actions), to the loss: unlike the sampled KL loss, it "
                                 "pulls back an action the policy has nearly dropped (algorithms/kl.py)", ge=0)
    all_action_coeff: float = opt(0.0, "value_table, rollout.constrain_actions: add this times the all-action loss, "
                                  "every allowed token moved by its table value (algorithms/value_table.py)", ge=0)
    recompute_old_log_probs: str = opt(
        "auto", "old log-probs of the ratio: auto (recompute when the update is off-policy within a step), "
        "true (always), false (never), rollout (the engine's sampling log-probs)",
        choices=("auto", "true", "false", "rollout"))
    rollout_correction: str = opt(
        "auto", "training on tokens the engine sampled with other weights (docs/async.md): behaviour (the PPO ratio "
        "and its clip against the engine's log-probs: a trust region around the policy that sampled), tis "
        "(decoupled PPO: clip on the recomputed old log-probs, weight each token by min(pi_old/pi_engine, tis_cap)), "
        "off, or auto (behaviour in the group stream, else off)", choices=("auto", "behaviour", "tis", "off"))
    tis_cap: float = opt(2.0, "rollout_correction=tis: the cap of the per-token importance weight", ge=1)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    use_kl_in_reward: bool = opt(False, "subtract kl_ctrl.kl_coef * KL(policy || reference) from the rewards; the "
                                 "reference is the policy RL starts from (after the warm-up, if any)")
    kl_penalty: str = opt("k1", "KL estimator of the reward penalty", choices=("k1", "k2", "k3", "abs"))
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_kl_loss: bool = opt(False, "add kl_loss_coef * KL(policy || reference) to the loss (reference: as use_kl_in_reward)")
    kl_loss_coef: float = opt(0.001, "KL loss coefficient", ge=0)
    kl_loss_type: str = opt("k3", "KL estimator of the loss term", choices=("k1", "k2", "k3", "abs"))
    kl_loss_schedule: str = opt("constant", "kl_loss_coef over the run's steps: constant, or toward 0 at the run's "
                                "end on a linear or cosine curve (in self-play: a policy held near its reference "
                                "keeps every action's share; the decay lets it go toward equilibrium)",
                                choices=("constant", "linear", "cosine"))
    ref_reset_steps: Optional[int] = opt(None, "every this many steps the reference policy becomes the current one "
                                         "(a reference reset: the KL term then anchors the policy where it was "
                                         "lately, not where RL began; in self-play a moving anchor, on toward "
                                         "equilibrium); null: never", ge=1)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)


# ------------------------------------------------------------------------------------------------------ model
@dataclass
class TinyModelConfig:
    """The embedded default's model: a tiny Qwen2 (0.36M parameters) with a locally trained BPE."""

    vocab_size: int = opt(1024, "BPE vocabulary, trained on the env's oracle episodes", ge=16)
    hidden_size: int = opt(128, "hidden width", ge=1)
    num_layers: int = opt(2, "decoder layers", ge=1)
    num_heads: int = opt(4, "attention heads", ge=1)
    num_kv_heads: int = opt(2, "key/value heads (grouped-query attention)", ge=1)
    intermediate_size: int = opt(256, "MLP width", ge=1)
    max_position_embeddings: int = opt(1024, "longest sequence", ge=1)
    head_dim: Optional[int] = opt(None, "per-head width (null: hidden_size / num_heads)", ge=1)
    seed: int = opt(0, "seed of the random initialisation")
    initializer_range: float = opt(0.1, "init std (with HF's 0.02 the copy task takes 3-10x the steps)", gt=0)


@dataclass
class LoraConfig:
    enabled: bool = opt(False, "train LoRA adapters instead of the full model")
    r: int = opt(8, "adapter rank", ge=1)
    alpha: float = opt(16.0, "adapter scale numerator", gt=0)
    dropout: float = opt(0.0, "adapter dropout", ge=0)
    use_rslora: bool = opt(False, "scale B @ A by alpha / sqrt(r) instead of alpha / r")
    target_modules: List[str] = opt(["q_proj", "v_proj"], "module names that get adapters")


@dataclass
class ModelConfig:
    path: Optional[str] = opt(None, "a local Hugging Face model folder (null: build the tiny model)")
    recipe: str = opt("pretrained", "the settings the `model` option chose: `tiny` (the embedded model's lr and "
                                    "warm-up, chosen when model.path is null) or `pretrained` (safe for a pretrained "
                                    "model: lr 1e-6, no warm-up; chosen when model.path is set)",
                      choices=("tiny", "pretrained"))
    chat_template: Optional[str] = opt(None, "Jinja chat template, or a file holding one, for a tokenizer without "
                                             "one (null: the tokenizer's own)")
    dtype: str = opt("float32", "parameter dtype", choices=("float32", "fp32", "bfloat16", "bf16", "float16", "fp16"))
    save_dir: Optional[str] = opt(None, "where the built tiny model is saved (null: <run_dir>/model)")
    gradient_checkpointing: bool = opt(False, "recompute each layer's activations in backward")
    corpus_tasks: Optional[int] = opt(None, "tiny model: the tokenizer learns from the oracle episodes of the "
                                            "first N training tasks (null: all)", ge=1)
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)


# ---------------------------------------------------------------------------------------------------- rollout
@dataclass
class RolloutConfig:
    """The agent loop (``rollout.AgentLoop``) and ``openmanus-rl rollout``."""

    engine: str = opt("hf", "rollout engine (registry `openmanus_rl.engines`)")
    engine_kwargs: Dict[str, Any] = opt({}, "engine constructor arguments (checked by the engine)")
    n: int = opt("${algorithm.n}", "samples per task (the group size of group-based estimators)", ge=1)
    max_turns: int = opt("${env.max_turns}", "model replies per episode", ge=1)
    max_prompt_tokens: int = opt(512, "memory=full: the first prompt's tokens (a longer one is cut, observation first)", ge=1)
    max_response_tokens: int = opt(512, "memory=full: every token after the prompt (replies + observations) of an "
                                        "episode", ge=1)
    max_sample_tokens: int = opt(1024, "per-turn memories: one turn sample's tokens (context + reply); the context "
                                       "is cut to fit, the episode's length is not bounded by it", ge=2)
    max_obs_tokens: int = opt(128, "one observation's tokens (longer ones keep their head and tail around "
                                   "`[...]`)", ge=1)
    max_new_tokens: int = opt(64, "one reply's tokens", ge=1)
    temperature: float = opt(1.0, "sampling temperature", gt=0)
    top_p: float = opt(1.0, "nucleus sampling mass", gt=0)
    top_k: int = opt(0, "top-k sampling (0: off)", ge=0)
    greedy: bool = opt(False, "argmax decoding")
    constrain_actions: bool = opt(False, "decode each reply as one of the env's legal actions, written by the "
                                         "template (envs with action_choices(), e.g. openspiel; others reply "
                                         "freely; rollout/choices.py)")
    env_timeout_s: float = opt(30.0, "limit of one env.reset / env.step call (past it: env_error)", gt=0)
    env_workers: int = opt(0, "threads for env calls (0: one per live episode)", ge=0)
    mode: str = opt("lockstep", "lockstep: one generate over every live episode per turn, the turn waits for its "
                                "slowest env call (reproducible); episodes: each episode moves on when its own env "
                                "call returns (for envs with slow or uneven latency; docs/async.md)",
                    choices=("lockstep", "episodes"))
    gen_batch_size: int = opt(0, "mode=episodes: most episodes per generate call (0: every ready one)", ge=0)
    gen_wait_ms: float = opt(10.0, "mode=episodes: how long ready episodes wait for others before a generate call; "
                                   "agents (gateway): how long a batch of requests waits for the next one while "
                                   "some running agent has not asked", ge=0)
    max_staleness: Optional[int] = opt(None, "the group stream (docs/async.md): a trained sample's tokens are at most "
                                             "this many optimizer steps old; groups keep running across steps, "
                                             "episodes on their own whatever `mode` says (null: no stream, each "
                                             "step rolls out its own batch)", ge=0)
    overlap_update: bool = opt(False, "the stream at max_staleness=0: the policy gradient of each complete group is "
                                      "computed while the rest of the batch still plays, and one optimizer step "
                                      "follows the last group: the same update as all at once (group-baseline "
                                      "estimators, one mini-batch and epoch, no critic or KL; docs/async.md)")
    stale_policy: str = opt("wait", "the stream, for a group that would be trained staler than max_staleness: wait "
                                    "(the step waits for it and trains it first: long episodes are never dropped) "
                                    "or drop (never waits; such groups are discarded and counted)",
                            choices=("wait", "drop"))
    keep_env_errors: bool = opt(False, "keep env_error episodes in the loss (else their response mask is zeroed)")
    sleep_after_rollout: bool = opt(True, "put the engine to sleep after each rollout (frees device memory)")
    num_tasks: int = opt(16, "`openmanus-rl rollout`: how many tasks it plays (generated ids, or the first rows "
                             "of data.val_files)", ge=1, commands=ROLLOUT)
    task_offset: int = opt(0, "`openmanus-rl rollout`: first generated task id", ge=0, commands=ROLLOUT)
    tasks_file: Optional[str] = opt(None, "`openmanus-rl rollout`: parquet or jsonl task rows (all of them)",
                                    commands=ROLLOUT)
    batch_size: int = opt(64, "`openmanus-rl rollout`: episodes per engine batch", ge=1, commands=ROLLOUT)
    output_dir: Optional[str] = opt(None, "`openmanus-rl rollout`: output folder (null: "
                                          "<trainer.output_dir>/<date>/<time>-rollout-<env>)",
                                    commands=ROLLOUT)
    device: str = opt("cpu", "`openmanus-rl rollout`: the engine's device", commands=ROLLOUT)


# --------------------------------------------------------------------------------------------------- training
@dataclass
class OptimConfig:
    """AdamW plus an LR schedule with one scheduler step per training step, and the update's batching."""

    lr: float = opt(1.0e-6, "learning rate (model=tiny: 5e-4)", gt=0)
    betas: List[float] = opt([0.9, 0.999], "AdamW betas")
    eps: float = opt(1.0e-8, "AdamW eps", gt=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0)
    lr_schedule: str = opt("constant", "LR schedule after the warm-up", choices=("constant", "cosine", "linear"))
    lr_warmup_steps: int = opt(0, "linear LR ramp over the first steps", ge=0)
    min_lr_ratio: float = opt(0.0, "cosine/linear: the final LR as a fraction of lr", ge=0)
    grad_clip: float = opt(1.0, "clip_grad_norm_ max norm (0: no clipping; the norm is still reported)", ge=0)
    ppo_epochs: int = opt(1, "passes over each step's batch", ge=1)
    ppo_mini_batch_size: Optional[int] = opt(None, "trajectories per optimizer step over all ranks "
                                                   "(null: the whole batch)", ge=1)
    micro_batch_size: Optional[int] = opt(None, "rows per forward pass on a rank (gradient accumulation; also "
                                                "the forward passes outside the update; null: all at once)", ge=1)
    max_tokens_per_micro_batch: Optional[int] = opt(None, "token budget of one forward pass on a rank: rows sorted "
                                                          "by length, each micro-batch at most this many "
                                                          "rows x longest-row tokens (also the forward passes outside "
                                                          "the update; null: by micro_batch_size only)", ge=1)
    sharding: str = opt("auto", "how the ranks hold the model: full (FSDP2, parameters, gradients and optimizer "
                                "sharded), grad_op (gradients and optimizer sharded, parameters gathered once per "
                                "step), replicate (a whole copy per rank, gradients all-reduced once per step), "
                                "auto (replicate when the training state fits easily in a rank's memory, else "
                                "grad_op, else full; the start-up line says which)",
                        choices=("auto", "full", "grad_op", "replicate"))
    shuffle: bool = opt(True, "shuffle rows into mini-batches (a fixed function of seed and step)")


@dataclass
class ActorConfig(OptimConfig):
    """The policy (ActorWorker)."""

    log_prob_micro_batch_size: Optional[int] = opt(None, "rows per forward pass of the old/reference log-probs "
                                                         "(null: all at once)", ge=1)
    log_prob_max_tokens_per_micro_batch: Optional[int] = opt(None, "token budget of one old/reference log-prob "
                                                                   "forward pass (rows sorted by length; null: by "
                                                                   "log_prob_micro_batch_size only)", ge=1)
    pack_rows: bool = opt(False, "pack each micro-batch's rows into one sequence with per-row position ids "
                                 "(no padding at all; needs an attention implementation that masks packed "
                                 "sequences from position ids: transformers' sdpa/eager, flash-attention varlen; "
                                 "else only the all-padding columns are cut)")
    share_prompts: Optional[bool] = opt(None, "run the start that several rows' prompts share (a GRPO group's "
                                              "prompt; the system prompt and task of per-turn samples) once per "
                                              "forward pass, the rest of each row on its KV cache: the same "
                                              "log-probs and gradients for less compute "
                                              "(openmanus_rl_core/models/shared_prompt.py; null: on a CPU, off on a GPU, "
                                              "where its masked attention measured slower: bench/RESULTS.md)")


@dataclass
class CriticConfig(OptimConfig):
    """The value model (CriticWorker; only with algorithm.use_critic)."""

    lr: float = opt(1.0e-5, "learning rate (model=tiny: 2e-3)", gt=0)
    value_clip: Optional[float] = opt(0.5, "clipped value loss range (null: unclipped)", gt=0)
    warmup_steps: int = opt(0, "train only the critic for this many first steps", ge=0)


@dataclass
class WarmupConfig:
    """Supervised warm-up on the env's oracle demonstrations (needs an OracleEnv), before RL."""

    enabled: bool = opt(False, "run the warm-up (model=tiny: true)")
    steps: int = opt(120, "optimizer steps (0: off)", ge=0)
    batch_size: int = opt(16, "demonstrations per step", ge=1)
    lr: float = opt(1.0e-5, "peak learning rate (model=tiny: 2e-3)", gt=0)
    lr_schedule: str = opt("constant", "after a linear ramp over warmup_ratio * steps", choices=("constant", "cosine"))
    warmup_ratio: float = opt(0.4, "fraction of the steps spent ramping the LR up", ge=0)
    grad_clip: float = opt(1.0, "clip_grad_norm_ max norm (0: off)", ge=0)
    num_demos: Optional[int] = opt(None, "demonstrations from the first N training tasks (null: all)", ge=1)
    demonstrator: str = opt("oracle", "who plays the tasks without a demonstration of their own: oracle (the env's "
                                      "oracle_action), model (warmup.model_path, greedily) or a systematic "
                                      "demonstrator the env offers (its demonstrators)")
    model_path: Optional[str] = opt(None, "warmup.demonstrator=model: the model folder that plays the demonstrations")
    keep: str = opt("all", "which demonstrations train: all (successes and failures) or success (filtered BC)",
                    choices=("all", "success"))
    validate: bool = opt(True, "validate right after the warm-up (warmup/val/* metrics at step 0)")


@dataclass
class DataConfig:
    """Task files: parquet, one row per task (see ``openmanus_rl_core/data/tasks.py``)."""

    dir: str = opt("${oc.env:OPENMANUS_RL_DATA,${trainer.output_dir}/data}/${env.name}",
                   "where `openmanus-rl data make` writes train.parquet / val.parquet")
    train_files: Any = opt(None, "a parquet path or a list of them (null: the trainer generates the split "
                                 "into <run_dir>/data, env.train_tasks tasks)")
    val_files: Any = opt(None, "as train_files, for validation (null: generated, env.val_tasks tasks)")
    train_batch_size: int = opt(16, "tasks per training step (each one rollout.n times)", ge=1)
    shuffle: bool = opt(True, "reshuffle the training tasks every epoch (a fixed function of data.seed)")
    seed: int = opt("${seed}", "seed of the generated tasks and of the sampler's shuffle")
    rollouts: Optional[str] = opt(None, "`data from-rollouts`: the rollout's trajectories.jsonl (or its folder)",
                                  commands=("data",))
    keep: str = opt("success", "`data from-rollouts`: which episodes become demonstrations: success (the env said "
                               "so) or reward (reward >= data.min_reward)", choices=("success", "reward"),
                    commands=("data",))
    min_reward: float = opt(1.0, "`data from-rollouts` with data.keep=reward: the lowest reward kept",
                            commands=("data",))
    output: Optional[str] = opt(None, "`data from-rollouts`: the parquet file to write (null: "
                                      "demonstrations.parquet next to the trajectories)", commands=("data",))


@dataclass
class TrainerConfig:
    """The fit loop, its worker groups, validation, checkpoints, and `openmanus-rl eval`."""

    total_steps: int = opt(60, "RL training steps (0: the warm-up alone, validated and saved as step 0; a resume "
                               "with more steps continues from it)", ge=0)
    ray_address: Optional[str] = opt(None, "null: start a local Ray; `auto`: join `ray start --head`")
    num_cpus: Optional[int] = opt(None, "CPUs of the local Ray (null: this machine's cores)", ge=1)
    log_to_driver: bool = opt(True, "show the workers' output on the driver console")
    num_workers: int = opt(2, "workers per group (one FSDP2 process group each)", ge=1)
    worker_num_cpus: Optional[float] = opt(None, "Ray CPUs per worker (null: the cluster's CPUs shared among all "
                                                 "workers, at most 1)", gt=0)
    placement_strategy: str = opt("SPREAD", "Ray placement group strategy of each worker group",
                                  choices=("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK"))
    worker_num_gpus: Optional[float] = opt(None, "GPUs per worker (null: 1, or 1/2 with a critic, when the "
                                                 "cluster has GPUs, else 0)", ge=0)
    device: str = opt("auto", "worker device", choices=("auto", "cpu", "cuda"))
    torch_threads: int = opt(1, "torch threads per worker process", ge=1)
    driver_threads: Optional[int] = opt(None, "torch threads of the driver (null: all cores)", ge=1)
    mixed_precision: Optional[str] = opt(None, "FSDP2 compute dtype (gradients reduced in fp32)",
                                         choices=("bf16", "bfloat16", "fp16", "float16"))
    output_dir: str = opt("outputs", "every command's outputs: runs in <output_dir>/<date>/<time>-<env>, rollouts in "
                                     "<date>/<time>-rollout-<env>, `data make` files in data/<env>")
    run_dir: Optional[str] = opt(None, "this run's folder (set it to resume with resume=auto)")
    resume: Optional[str] = opt(None, "null (fresh; an error if run_dir already holds checkpoints or metrics) | auto "
                                "(the newest checkpoint of run_dir that verifies and loads, falling back to older ones; "
                                "an error if none does) | never (fresh; an earlier run's checkpoints and metrics are "
                                "moved to run_dir/previous/) | <checkpoint folder or run directory>",
                                commands=("train",),
                                instead=dict.fromkeys(FROM_CHECKPOINT, "the checkpoint they read is trainer.checkpoint"))
    val_freq: int = opt(10, "validate every N steps (0: never; also at the end, see val_at_end)", ge=0)
    val_before_train: bool = opt(True, "validate the untrained model (step 0)")
    val_at_end: bool = opt(True, "validate after the last step")
    val_greedy: bool = opt(True, "validation (and eval) decode greedily")
    val_temperature: float = opt(1.0, "validation temperature when not greedy", gt=0)
    val_max_tasks: Optional[int] = opt(None, "validate on the first N validation tasks (null: all)", ge=1)
    val_samples_to_log: int = opt(0, "print this many validation replies", ge=0)
    save_freq: int = opt(10, "checkpoint every N steps (0: never; also at the end, see save_at_end)", ge=0)
    save_at_end: bool = opt(True, "checkpoint after the last step")
    max_checkpoints: Optional[int] = opt(3, "keep the newest N checkpoints (null: all)", ge=1)
    loggers: List[str] = opt(["tensorboard"], "trackers: tensorboard (events next to metrics.jsonl, with the config and "
                                              "hparams), and installed tracker plugins such as wandb, mlflow")
    tracker_kwargs: Dict[str, Any] = opt({}, "tracker name (one of loggers) -> its settings, checked against the "
                                              "tracker's Kwargs, e.g. trainer.tracker_kwargs.wandb.project=my-runs")
    progress: bool = opt(True, "show a progress bar on a terminal (a plain line per step when stderr is not one; "
                               "false: a plain line per step always)")
    save_rollouts: bool = opt(False, "write each step's trained batch to <run_dir>/rollouts/step_N.parquet, named "
                                     "by the next checkpoint (`openmanus-rl replay` reads them; docs/rollout-records.md)")
    checkpoint: Optional[str] = opt(None, "`openmanus-rl eval`: the checkpoint folder or run directory",
                                    commands=FROM_CHECKPOINT,
                                    instead={"train": "to continue a run, use trainer.run_dir=<run> "
                                                      "trainer.resume=auto (or trainer.resume=<checkpoint>)"})
    eval_output: Optional[str] = opt(None, "`openmanus-rl eval`: also write the result as JSON here",
                                     commands=("eval",))
    no_signal_warn_steps: int = opt(3, "warn when every advantage was 0 for N steps in a row (0: never)", ge=0)
    max_env_error_steps: int = opt(3, "abort (exit 1, naming the first error) when every episode of N steps in a "
                                      "row ended as env_error (0: never)", ge=0)
    max_worker_restarts: int = opt(2, "worker-group failures recovered from the newest checkpoint per run", ge=0)
    stop_grace_s: float = opt(30.0, "after a first SIGTERM / Ctrl-C: seconds to the exit at the latest (a rollout or "
                                    "validation in progress is abandoned, an update finishes, a checkpoint is saved; "
                                    "past it the run exits without a new checkpoint)", gt=0, commands=("train",))


@dataclass
class Config:
    """The whole composed configuration (``openmanus-rl <command> --cfg job`` prints it)."""

    seed: int = opt(0, "seed of everything (tasks, sampling, initialisation, shuffles)")
    env: EnvConfig = field(default_factory=EnvConfig)
    template: NamedComponentConfig = field(default_factory=NamedComponentConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    allocator: NamedComponentConfig = field(default_factory=NamedComponentConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
