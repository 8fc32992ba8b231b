"""Models and tokenizers: any Hugging Face causal LM by local path, or the embedded tiny default.

The embedded default needs no download: :func:`build_tokenizer` trains a byte-level BPE on texts the caller
supplies (env oracle episodes, system prompts, ...) with the ``tokenizers`` library and wraps it as a
``PreTrainedTokenizerFast`` that speaks Qwen's ChatML; :func:`build_tiny_model` builds a randomly initialised
Qwen2 causal LM sized by config. :func:`load_model_and_tokenizer` picks one of the two from ``cfg.model``.

ChatML as rendered by :data:`CHATML_TEMPLATE` (Qwen2/2.5 without the default system message)::

    <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{user}<|im_end|>\\n<|im_start|>assistant\\n

EOS is ``<|im_end|>`` (the end of an assistant turn: generation stops there), pad is ``<|endoftext|>``, padding
is on the left (the side generation needs; passed to the constructor so that ``save_pretrained`` keeps it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from openmanus_rl_core.config.schema import LoraConfig, ModelConfig
from openmanus_rl_core.models.chat_template import CHATML_TEMPLATE

__all__ = [
    "ENDOFTEXT",
    "IM_START",
    "IM_END",
    "SPECIAL_TOKENS",
    "CHATML_TEMPLATE",
    "build_tokenizer",
    "build_tiny_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "apply_lora",
    "merge_lora_state",
    "transposed_modules",
    "check_model",
    "ModelError",
    "cache_keyword",
]

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
"""Ids 0, 1, 2 of every tokenizer :func:`build_tokenizer` trains (special tokens come first)."""

# Texts always added to the tokenizer corpus, so the chat scaffolding ("system", "user", "assistant", newlines)
# gets merged tokens even when the caller's corpus is small.
_SCAFFOLD = ["system\n", "user\n", "assistant\n", "\n", "You are a helpful assistant."]


def build_tokenizer(texts: Iterable[str], vocab_size: int = 512, out_dir: str | Path | None = None):
    """Train a byte-level BPE on ``texts`` and return it as a ``PreTrainedTokenizerFast``.

    Every byte is in the initial alphabet, so any text (any language, any bytes) round-trips through
    encode/decode; ``vocab_size`` (>= 259: 256 bytes + 3 special tokens) bounds the merges learnt on top.
    Deterministic: the same texts give the same vocabulary and merges. ``out_dir``: also ``save_pretrained`` there.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [str(t) for t in texts] + _SCAFFOLD * 4  # repeated: min_frequency=2 must not drop the scaffolding
    min_size = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_size:
        raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE; use at least {min_size}")

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Sorted input: the learnt merges then cannot depend on the order the caller's texts came in.
    tok.train_from_iterator(sorted(corpus), trainer=trainer)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        padding_side="left",
        chat_template=CHATML_TEMPLATE,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    # Make sure <|im_start|> is a special token the fast tokenizer never splits.
    hf_tok.add_special_tokens({"additional_special_tokens": [IM_START]})
    if out_dir is not None:
        hf_tok.save_pretrained(str(out_dir))
    return hf_tok


def build_tiny_model(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    head_dim: int | None = None,
    dtype: Any = "float32",
    initializer_range: float = 0.02,
):
    """A randomly initialised ``Qwen2ForCausalLM`` sized for a CPU, its vocabulary matching ``tokenizer``.

    Tied input/output embeddings; ``eos``/``pad``/``bos`` ids from the tokenizer (bos falls back to pad, as in
    Qwen). ``head_dim`` defaults to ``hidden_size // num_heads``. Same ``seed`` -> same weights.
    ``initializer_range``: std of the normal init of every linear and embedding weight (HF's default 0.02 is
    tuned for wide models; a 128-wide model learns to copy a word from its context in a fraction of the steps
    with 0.1, as the start is then off the flat region where attention is uniform).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden_size % num_heads and head_dim is None:
        raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}; set head_dim")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
    pad_id = tokenizer.pad_token_id
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad_id
    kwargs: dict[str, Any] = {}
    if head_dim is not None:
        kwargs["head_dim"] = int(head_dim)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        use_cache=True,
        rope_theta=10000.0,
        initializer_range=float(initializer_range),
        **kwargs,
    )
    torch_dtype = _dtype(dtype)
    with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's global RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model = model.to(torch_dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = bos_id
    model.eval()
    return model


def _dtype(dtype: Any):
    import torch

    if dtype is None or dtype == "auto":
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).replace("torch.", "")
    aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16", "float": "float32"}
    name = aliases.get(name, name)
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown model dtype {dtype!r}; use float32, bfloat16 or float16")
    return value


class ModelError(ValueError):
    """A model or tokenizer that cannot be used: one message naming the folder, what is wrong and the key that fixes
    it (``openmanus-rl`` prints it and exits with status 2)."""


def chat_template_text(chat_template: str | None) -> str | None:
    """``model.chat_template`` as Jinja text: the contents of the file it names, or the string itself."""
    if not chat_template:
        return None
    if "{" not in chat_template:  # a Jinja template has tags; anything else is read as a file path
        path = Path(chat_template).expanduser()
        if not path.is_file():
            raise ModelError(f"model.chat_template={chat_template!r} is neither a Jinja template (no '{{' in it) nor "
                             "a file; give the template text or the path of a .jinja file")
        return path.read_text(encoding="utf-8")
    return chat_template


def load_tokenizer(model_dir: str, chat_template: str | None = None):
    """The tokenizer of a local Hugging Face folder, padding on the left, pad = eos when it has no pad token.

    ``chat_template`` (``model.chat_template``: Jinja text or a file holding it) replaces the folder's template;
    the one place a tokenizer gets a template it does not ship with.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, padding_side="left")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    template = chat_template_text(chat_template)
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def check_model(model_cfg: ModelConfig) -> None:
    """Check ``model.path`` before anything starts (no Ray, no weights loaded); raise :class:`ModelError` naming
    the first problem: a missing folder or config.json, a tokenizer that does not load, no chat template (neither
    the tokenizer's nor ``model.chat_template``), no EOS token, a vocabulary larger than the model's embedding,
    LoRA target modules the model does not have. The embedded tiny model (``path`` null) always passes."""
    if not model_cfg.path:
        chat_template_text(model_cfg.chat_template)
        return
    where = f"model.path={model_cfg.path}"
    folder = Path(model_cfg.path).expanduser()
    if not (folder / "config.json").is_file():
        raise ModelError(f"{where}: {'no config.json in that folder' if folder.is_dir() else 'no such folder'}; give "
                         "a local Hugging Face model folder (config.json, weights, tokenizer files), or model.path=null "
                         "for the embedded tiny model")
    import torch  # after the folder's check: a wrong path is told without the seconds these imports take
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise ModelError(f"{where}: config.json does not load: {_first_line(exc)}") from None
    try:
        tokenizer = load_tokenizer(str(folder), model_cfg.chat_template)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"{where}: the tokenizer does not load: {_first_line(exc)}; the folder needs "
                         "tokenizer.json or the slow tokenizer's files") from None
    if not tokenizer.chat_template:
        raise ModelError(f"{where}: the tokenizer has no chat template; set model.chat_template to the template text "
                         "or to a .jinja file (the ChatML one: docs/models.md)")
    if tokenizer.eos_token_id is None:
        raise ModelError(f"{where}: the tokenizer has no EOS token, so a reply could never end; add eos_token to "
                         "tokenizer_config.json")
    vocab = getattr(config.get_text_config(), "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise ModelError(f"{where}: the tokenizer has {len(tokenizer)} tokens but the model's embedding only "
                         f"{vocab}; the tokenizer belongs to another model")
    if model_cfg.lora.enabled:
        with torch.device("meta"):  # module names only: no memory, no weights read
            skeleton = AutoModelForCausalLM.from_config(config)
        leaves = {name.rsplit(".", 1)[-1] for name, _ in skeleton.named_modules()}
        missing = [t for t in model_cfg.lora.target_modules if t not in leaves]
        if missing:
            linear = sorted({n.rsplit(".", 1)[-1] for n, m in skeleton.named_modules()
                             if isinstance(m, _adaptable_layers()) and "." in n})
            raise ModelError(f"model.lora.target_modules: {missing} not in this {config.model_type} model; its "
                             f"linear layers are {linear}")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _adaptable_layers() -> tuple[type, ...]:
    """The layer classes LoRA can wrap here: ``nn.Linear`` and transformers' ``Conv1D`` (GPT-2's transposed one)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    return (torch.nn.Linear, Conv1D)


def load_model_and_tokenizer(
    model_cfg: ModelConfig,
    corpus: Iterable[str] | None = None,
    save_dir: str | Path | None = None,
):
    """``(model, tokenizer)`` as ``cfg.model`` describes them.

    - ``model_cfg.path`` set: ``AutoModelForCausalLM`` / :func:`load_tokenizer` from a local folder (never the
      hub: ``local_files_only=True``).
    - otherwise: the tiny default from ``model_cfg.tiny``, its tokenizer trained on ``corpus``.

    ``model_cfg.dtype`` (float32 / bfloat16 / float16) sets the weights' dtype. ``save_dir`` (or
    ``model_cfg.save_dir``): ``save_pretrained`` both there, so other processes load the very same files with
    ``path=save_dir``. LoRA is not applied here (see :func:`apply_lora`; the trainer decides where).
    """
    import dataclasses

    from transformers import AutoModelForCausalLM

    dtype = _dtype(model_cfg.dtype)
    if model_cfg.path:
        p = Path(model_cfg.path).expanduser()
        if not p.exists():
            raise FileNotFoundError(
                f"model.path={model_cfg.path!r} does not exist; give a local folder holding a Hugging Face model "
                "(config.json, weights, tokenizer files), or set model.path=null for the embedded tiny model"
            )
        tokenizer = load_tokenizer(str(p), model_cfg.chat_template)
        model = AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True, dtype=dtype)
        model.eval()
    else:
        tiny = dataclasses.asdict(model_cfg.tiny)
        tokenizer = build_tokenizer(list(corpus) if corpus is not None else [], vocab_size=tiny.pop("vocab_size"))
        model = build_tiny_model(tokenizer, dtype=dtype, **tiny)
    save_dir = save_dir or model_cfg.save_dir
    if save_dir:
        Path(str(save_dir)).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(save_dir))
        tokenizer.save_pretrained(str(save_dir))
    return model, tokenizer


def apply_lora(model, lora_cfg: LoraConfig):
    """Wrap ``model`` with PEFT LoRA when ``lora_cfg.enabled``; otherwise return it unchanged (``use_rslora``
    False: ``B @ A`` scaled by ``alpha / r``; True: ``alpha / sqrt(r)``)."""
    if not lora_cfg.enabled:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    # GPT-2's Conv1D layers store (in, out): PEFT must know, or it warns and guesses per layer.
    conv = {name.rsplit(".", 1)[-1] for name in transposed_modules(model)}
    config = PeftLoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                            use_rslora=lora_cfg.use_rslora, target_modules=list(lora_cfg.target_modules),
                            fan_in_fan_out=bool(conv & set(lora_cfg.target_modules)), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def lora_scaling(lora_cfg: LoraConfig) -> float:
    """The factor PEFT multiplies ``B @ A`` by: ``alpha / r``, or ``alpha / sqrt(r)`` with ``use_rslora``."""
    if lora_cfg.r < 1:
        raise ValueError(f"model.lora.r must be >= 1, got {lora_cfg.r}")
    return lora_cfg.alpha / (lora_cfg.r ** 0.5) if lora_cfg.use_rslora else lora_cfg.alpha / lora_cfg.r


def transposed_modules(model) -> frozenset[str]:
    """Names of ``model``'s layers that store their weight as ``(in_features, out_features)``: transformers'
    ``Conv1D`` (GPT-2 and its family), where ``nn.Linear`` stores ``(out, in)``. Plain Hugging Face names
    (``transformer.h.0.attn.c_attn``), also for a PEFT-wrapped model; what :func:`merge_lora_state` needs."""
    from transformers.pytorch_utils import Conv1D

    return frozenset(_plain_name(name) for name, module in model.named_modules() if isinstance(module, Conv1D))


def _plain_name(key: str) -> str:
    """A PEFT state-dict key or module name as the plain model names it."""
    name = key[len("base_model.model."):] if key.startswith("base_model.model.") else key
    return name.replace(".base_layer", "")


def merge_lora_state(state_dict: Mapping[str, Any], scaling: float,
                     transposed: Collection[str] = frozenset()) -> dict[str, Any]:
    """A PEFT LoRA model's full state dict -> the plain model's, with each adapter merged into its base weight.

    ``base_model.model.<m>.base_layer.weight`` + ``scaling * lora_B @ lora_A`` becomes ``<m>.weight`` (the product
    is taken in float32, the result keeps the base weight's dtype); other keys lose the ``base_model.model.`` prefix
    and the adapter tensors are dropped. Rollout engines (HF, vLLM) then load plain Hugging Face names and run
    without adapter branches. A state dict without LoRA keys comes back with its keys unchanged.

    ``transposed``: the modules whose weight is stored ``(in, out)`` (:func:`transposed_modules` of the model;
    GPT-2's ``Conv1D``); they get ``(B @ A).T``. ``B @ A`` is ``(out, in)`` for every module.
    """
    sd = dict(state_dict)
    transposed = frozenset(transposed)
    adapters: dict[str, dict[str, Any]] = {}  # module prefix -> {"A": tensor, "B": tensor}
    for key, value in sd.items():
        for part, tag in ((".lora_A.", "A"), (".lora_B.", "B")):
            if part in key:
                adapters.setdefault(key.split(part)[0], {})[tag] = value
        if ".lora_embedding_" in key or ".lora_magnitude_vector" in key:
            raise NotImplementedError(f"merging {key!r} is not supported: only LoRA on linear layers is merged")
    out: dict[str, Any] = {}
    for key, value in sd.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        name = _plain_name(key)
        if ".base_layer." in key:
            prefix, leaf = key.split(".base_layer.", 1)
            ab = adapters.get(prefix)
            if leaf == "weight" and ab:
                if set(ab) != {"A", "B"}:
                    raise ValueError(f"LoRA module {prefix!r} has lora_{''.join(ab)} but not both lora_A and lora_B")
                delta = ab["B"].float() @ ab["A"].float()
                if _plain_name(prefix) in transposed:
                    delta = delta.T
                if delta.shape != value.shape:
                    hint = (" (the layer stores its weight transposed, as GPT-2's Conv1D does: pass "
                            "transposed=transposed_modules(model))" if delta.T.shape == value.shape else "")
                    raise ValueError(f"LoRA module {prefix!r}: B @ A has shape {tuple(delta.shape)}, "
                                     f"the base weight {tuple(value.shape)}{hint}")
                value = (value.float() + float(scaling) * delta.to(value.device)).to(value.dtype)
        out[name] = value
    return out


def avoid_cudnn_attention(device: Any) -> None:
    """On a CUDA device, keep PyTorch's scaled-dot-product attention off its cuDNN kernel (process-wide).

    That kernel builds an execution plan for every new sequence shape, and a rollout or an update meets new shapes
    all the time. Measured on an H200 (torch 2.11, bench/RESULTS.md, "GPU"): the HF engine's first generate of 64
    prompts ran at 1,068 tokens/s with cuDNN attention and 3,768 without (flash / memory-efficient kernels).
    """
    import torch

    if torch.device(device).type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def cache_keyword(model: Any) -> str:
    """The KV-cache argument (and output field) of a causal LM's forward: ``cache`` in newer transformers, where
    ``past_key_values`` is deprecated; ``past_key_values`` before. A PEFT wrapper is looked through."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def recipe_line(cfg: Any, resumed_from: Any = None) -> str:
    """The settings a run most easily gets wrong for its model, in one line printed at start; ``resumed_from``: the
    checkpoint a resume continues from (the warm-up and the untrained validation ran before it, and are skipped)."""
    w = cfg.warmup
    warm = f"{w.steps} steps at lr {w.lr:g}" if w.enabled and w.steps > 0 else "off"
    if resumed_from is not None:
        warm = f"skipped (resuming from {Path(resumed_from).name}: the untrained validation and the warm-up ran " \
               f"before it)"
    model = cfg.model.path or "the embedded tiny model"
    critic = f", critic.lr {cfg.critic.lr:g}" if cfg.algorithm.use_critic else ""
    return f"recipe model={cfg.model.recipe} for {model}: actor.lr {cfg.actor.lr:g}{critic}, warm-up {warm}"
