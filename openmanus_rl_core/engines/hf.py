"""``hf``: a rollout engine on Hugging Face transformers (CPU or GPU), sampling done by our own code.

One :meth:`HFEngine.generate` call decodes every prompt of the batch together: prompts are left-padded, the
prefill is one forward pass, and each further token is one forward pass of the whole live batch over the KV cache
(``DynamicCache``). Rows that finished are dropped from the batch (and their KV cache rows with them) so that the
cost follows the number of live sequences; the loop ends as soon as every sequence has finished.

Sampling and the returned log-probabilities (the policy the trainer must agree with)::

    z      = logits / T                       (T = params.temperature; T = 1 when greedy with temperature <= 0)
    logp   = log_softmax(z)                   over the FULL vocabulary
    sample ~ softmax(top_p(top_k(z)))         (Gumbel-max with this engine's generator; greedy: argmax)
    logprob of the token = logp[token]        (before the top-k / top-p truncation)

This is verl's convention: the actor recomputes ``log_softmax(logits / T)`` over the full vocabulary, so the
rollout's ``old_log_prob`` and the actor's new one are the same function of the weights. (With top-p/top-k < full
the sampler is a truncation of that distribution; the small mismatch is the usual one and vanishes at top_p=1,
top_k=0.)

With a grammar constraint (``params.constraint``, :mod:`.constrained`), a row's ``z`` first has the tokens its
grammar forbids set to ``-inf``: ``logp`` is then ``log_softmax`` over the allowed tokens only, the distribution
the token was drawn from, and that is the log-probability recorded. The actor recomputes the unmasked
``log_softmax(logits / T)``; on a constrained token the two differ by ``-log`` (the allowed tokens' mass) >= 0, which
the update sees as it sees any rollout/trainer mismatch (``algorithms/correction.py``: ``rollout_correction=tis``
weights the token by ``min(pi_unmasked / pi_masked, cap)``, at most 1). Where the grammar forces text, its tokens
(each the only one allowed, log-probability 0) are appended at once and fed with the sampled token in one pass of
several positions, left-padded to the batch's longest (:mod:`.constrained`, "Forced text").

Stopping, per sequence: at an EOS token (the tokenizer's and the model's generation config's; the EOS token is kept
in ``token_ids``, left out of ``text``); at a stop string (decoded incrementally over the tail of the sequence; the
token that completes the stop string is the last one kept, so the stop string stays in the output and nothing
after that token is generated); at ``max_new_tokens`` with ``finish_reason="length"``.

Streaming (:attr:`HFEngine.streams_tokens`): ``generate(..., on_tokens=f)`` calls ``f(indices, tokens)`` once per
decoding step, from the decoding thread, with the output index of every row that got a token at that step and those
tokens (an EOS included), before the next step is computed. It reads what was sampled and changes nothing: the
results are those of the same call without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from openmanus_rl_core.engines import check_prompts
from openmanus_rl_core.models.loading import avoid_cudnn_attention, cache_keyword
from openmanus_rl_core.protocols import Generation, SamplingParams
from openmanus_rl_core.models import shared_prompt
from openmanus_rl_core.engines.fast_decode import FastDecode
from openmanus_rl_core.engines.constrained import Grammars, RowMatchers
from openmanus_rl_core.engines.prefix_cache import PrefixCache

__all__ = ["HFEngine", "filter_logits"]


def filter_logits(z: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Top-k then nucleus (top-p) truncation of ``z`` [B, V]: removed entries become ``-inf``.

    top-p keeps the smallest prefix of the sorted distribution whose mass reaches ``top_p`` (at least one token).
    """
    if top_k and 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        remove_sorted = mass_before >= top_p
        remove_sorted[..., 0] = False
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        z = z.masked_fill(remove, float("-inf"))
    return z


class HFEngine:
    """Batched sampling from a ``transformers`` causal LM; implements ``protocols.RolloutEngine``.

    ``model``: a causal LM (its ``forward`` takes ``input_ids``, ``attention_mask``, ``position_ids``,
    ``past_key_values``); ``tokenizer``: its tokenizer (decoding for stop strings and ``text``); ``device``: where
    the model runs (the model is moved there); ``seed``: seeds this engine's own sampling generator, so two engines
    with the same seed, weights and prompts sample the same tokens. ``num_threads``: torch intra-op threads while
    generating (restored afterwards); None leaves torch's setting. For a tiny model on a CPU, 1 is often several
    times faster than more (each decoding step is too small to split, and threads spin-wait on a busy machine).
    ``share_prompts``: prefill the start that several prompts share once (:meth:`_prefill`; ``rollout.engine_kwargs``
    turns it off). It is on by default: measured several times faster on a CPU, and the same speed on an H200
    (bench/RESULTS.md, "GPU"). ``prefix_cache_mb``: the most megabytes of keys and values kept from earlier calls,
    so that a multi-turn prompt prefills only what follows the last turn (:mod:`.prefix_cache`); 0 turns it off.
    ``fast_decode``: decoding steps of a Llama-family model run in plain torch calls (:mod:`.fast_decode`), not
    through the model's forward; other models always use their forward. None: on a CPU, where it was measured
    (bench/hf_engine.py), and off on an accelerator, where it is not yet and where its fused copy of the q/k/v and
    gate/up weights takes memory.
    """

    # generate() takes on_tokens: each step's new tokens as they are sampled (the gateway streams them).
    streams_tokens = True

    def __init__(self, model: Any, tokenizer: Any, device: str | torch.device = "cpu", seed: int = 0,
                 num_threads: int | None = None, share_prompts: bool = True, prefix_cache_mb: float = 1024,
                 fast_decode: bool | None = None):
        self.num_threads = int(num_threads) if num_threads else None
        self.device = torch.device(device)
        self.share_prompts = bool(share_prompts)
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 turns the prefix cache off), not {prefix_cache_mb}")
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None
        avoid_cudnn_attention(self.device)
        self.model = model.to(self.device)
        self.model.eval()
        if fast_decode is None:
            fast_decode = self.device.type == "cpu"
        self.fast = FastDecode.for_model(self.model) if fast_decode else None
        self.tokenizer = tokenizer
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id
        if pad is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
        self.pad_token_id = int(pad)
        self.eos_token_ids = self._eos_ids()
        # The fast tokenizer's Rust backend decodes without transformers' per-call Python overhead (stop-string
        # checks decode every live row at every step).
        backend = getattr(tokenizer, "_tokenizer", None)
        self._decode_tail = (
            (lambda ids: backend.decode(ids, skip_special_tokens=False)) if hasattr(backend, "decode")
            else (lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        )
        # Grammars compile against the tokenizer on first use (llguidance reads Hugging Face fast tokenizers).
        self.grammars = Grammars(tokenizer, self.eos_token_ids) if hasattr(tokenizer, "backend_tokenizer") else None
        self.calls = 0  # generate() calls so far (metrics, tests)
        self.asleep = False

    @property
    def cache_kw(self) -> str:
        """The forward keyword of this model's KV cache."""
        return cache_keyword(self.model)

    # ------------------------------------------------------------------------------------------------- memory
    def sleep(self, level: int | None = None) -> None:
        """Free accelerator memory while the colocated actor trains: the model moves to CPU memory.

        On a CPU engine only the state changes. ``generate`` and ``update_weights`` call :meth:`wake_up` first.
        ``level`` is accepted for the common engine call and ignored (the weights are always kept).
        """
        if self.asleep:
            return
        self._forget_weights()
        if self.device.type != "cpu":
            self.model.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.asleep = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Move the model back to its device (no-op when awake)."""
        if not self.asleep:
            return
        if self.device.type != "cpu":
            self.model.to(self.device)
        self.asleep = False

    def reset_prefix_cache(self) -> None:
        """Forget the keys and values of earlier calls (:mod:`.prefix_cache`)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def _forget_weights(self) -> None:
        """Drop what was computed from the current weights (new ones are coming, or their memory is freed): the
        prefix cache's keys and values, and the fused decoding step's products."""
        self.reset_prefix_cache()
        if self.fast is not None:
            self.fast.release()

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.tokenizer.eos_token_id, getattr(getattr(self.model, "generation_config", None),
                                                            "eos_token_id", None)):
            if source is None:
                continue
            ids.update(int(i) for i in (source if isinstance(source, (list, tuple, set)) else [source]))
        return ids

    # ------------------------------------------------------------------------------------------------- weights
    def update_weights(self, state_dict: dict[str, Any]) -> None:
        """Load new weights in memory (strict: every key must match). Tied ``lm_head.weight`` may be omitted."""
        self.wake_up()
        self._forget_weights()
        sd = dict(state_dict)
        own = self.model.state_dict()
        tied = getattr(getattr(self.model, "config", None), "tie_word_embeddings", False)
        if tied and "lm_head.weight" in own and "lm_head.weight" not in sd:
            emb = next((k for k in sd if k.endswith("embed_tokens.weight")), None)
            if emb is not None:
                sd["lm_head.weight"] = sd[emb]
        with torch.no_grad():
            self.model.load_state_dict(sd, strict=True)
        self.model.eval()

    # ---------------------------------------------------------------------------------------------- generation
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None,
                 on_tokens: Callable[[list[int], list[int]], None] | None = None) -> list[Generation]:
        """One :class:`Generation` per prompt, in order, from ONE batched decoding loop (see the module doc);
        ``on_tokens(indices, tokens)``: told each step's tokens as they are sampled (module doc, "Streaming")."""
        self.wake_up()
        before = torch.get_num_threads()
        if self.num_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(self.num_threads)
        try:
            return self._generate(prompts, params, on_tokens)
        finally:
            torch.set_num_threads(before)
            if self.fast is not None:
                self.fast.finish()  # the call's KV slabs go with it, however it ended

    def _prefill(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, prompts: Sequence[Sequence[int]],
                 hits: list | None):
        """The KV cache and next-token logits of the left-padded prompts, and the attention mask over the cache's
        columns, by whichever of three ways computes the fewest columns:

        - every prompt whole;
        - prompts that start alike (a GRPO group's samples; per-turn prompts of one task) run that start once, then
          each prompt's rest on the repeated cache (:mod:`openmanus_rl_core.models.shared_prompt`);
        - each prompt's rest after its prefix found in the prefix cache (``hits``: :meth:`PrefixCache.match` per
          prompt), on those cached keys and values (:meth:`_prefill_cached`)."""
        from transformers import DynamicCache

        kw = self.cache_kw
        B, P = ids.shape
        shared = shared_prompt.shared_starts(ids, attn, pos) if self.share_prompts else None
        cost = B * P if shared is None else shared.head_ids.numel() + B * shared.width
        if hits is not None and any(k for _, k in hits):
            if B * max(len(p) - k for p, (_, k) in zip(prompts, hits)) < cost:
                return self._prefill_cached(prompts, hits)
        if shared is None:
            out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                             **{kw: DynamicCache()})
            return getattr(out, kw), out.logits[:, -1, :].float(), attn
        head = self.model(input_ids=shared.head_ids, attention_mask=shared.head_mask, position_ids=shared.head_pos,
                          use_cache=True, logits_to_keep=1, **{kw: DynamicCache()})
        cache = getattr(head, kw)
        cache.batch_select_indices(shared.which)
        attn = torch.cat([shared.prefix_mask, shared.rest_mask], dim=1)
        W = shared.width
        out = self.model(input_ids=ids[:, -W:], attention_mask=attn, position_ids=pos[:, -W:], use_cache=True,
                         logits_to_keep=1, **{kw: cache})
        return getattr(out, kw), out.logits[:, -1, :].float(), attn

    def _prefill_cached(self, prompts: Sequence[Sequence[int]], hits: list):
        """:meth:`_prefill` on the prefix cache. The cache's columns: each row's cached prefix (``k`` tokens),
        left-padded to the longest; then each row's rest, left-padded to the longest rest, at positions ``k``
        onwards (the cached keys carry positions ``0..k-1``). A row with no hit has all its tokens in the rest."""
        from transformers import DynamicCache

        dev, B = self.device, len(prompts)
        found = torch.tensor([k for _, k in hits])
        rest = torch.tensor([len(p) for p in prompts]) - found
        C, W = int(found.max()), int(rest.max())
        layers = next(e for e, k in hits if k).kv
        kv = []
        for layer, (k0, v0) in enumerate(layers):
            keys = k0.new_zeros((B, k0.shape[0], C, k0.shape[-1]))
            values = v0.new_zeros((B, v0.shape[0], C, v0.shape[-1]))
            for b, (entry, k) in enumerate(hits):
                if k:
                    keys[b, :, C - k:] = entry.kv[layer][0][:, :k]
                    values[b, :, C - k:] = entry.kv[layer][1][:, :k]
            kv.append((keys, values))
        ids = torch.full((B, W), self.pad_token_id, dtype=torch.long)
        pos = torch.zeros((B, W), dtype=torch.long)
        for b, (p, k) in enumerate(zip(prompts, found.tolist())):
            ids[b, W - len(p) + k:] = torch.as_tensor(list(p[k:]), dtype=torch.long)
            pos[b, W - len(p) + k:] = torch.arange(k, len(p))
        prefix_mask = (torch.arange(C) >= C - found[:, None]).long()
        rest_mask = (torch.arange(W) >= W - rest[:, None]).long()
        attn = torch.cat([prefix_mask, rest_mask], dim=1).to(dev)
        kw = self.cache_kw
        out = self.model(input_ids=ids.to(dev), attention_mask=attn, position_ids=pos.to(dev), use_cache=True,
                         logits_to_keep=1, **{kw: DynamicCache(kv)})
        return getattr(out, kw), out.logits[:, -1, :].float(), attn

    def _remember(self, cache: Any, attn: torch.Tensor, rows: list[tuple[int, int]],
                  prompts: Sequence[Sequence[int]], out_ids: list[list[int]]) -> None:
        """Put the finished sequences into the prefix cache: for each ``(batch row, output index)``, the keys and
        values of its prompt and reply but the reply's last token (sampled, never fed back), the row's unmasked
        columns. A model whose cache is not one plain layer of every column per layer (sliding windows) turns
        the prefix cache off."""
        layers = getattr(cache, "layers", None)
        if layers is None or any(getattr(layer, "is_sliding", True) for layer in layers):
            self.prefix_cache = None
            return
        for r, i in rows:
            tokens = [*map(int, prompts[i]), *out_ids[i][:-1]]
            cols = attn[r].nonzero().squeeze(-1)
            if len(cols) != len(tokens):
                raise RuntimeError(f"the KV cache holds {len(cols)} columns of a sequence of {len(tokens)} tokens")
            self.prefix_cache.add(tokens, [(layer.keys[r].index_select(1, cols), layer.values[r].index_select(1, cols))
                                           for layer in layers])

    def _next_input(self, sampled: list[int], forced: list[list[int]],
                    last_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input ids [B, K], positions [B, K], attention columns [B, K])`` of the next forward pass: each row's
        sampled token and the tokens its grammar forced after it, left-padded to the longest (``K``); pad columns
        are masked out of every later step."""
        K = 1 + max(map(len, forced))
        if K == 1:
            ids = torch.tensor(sampled, dtype=torch.long, device=self.device)[:, None]
            return ids, last_pos + 1, torch.ones_like(ids)
        ids = torch.full((len(sampled), K), self.pad_token_id, dtype=torch.long)
        fed = torch.zeros((len(sampled), K), dtype=torch.long)
        for b, (t, ff) in enumerate(zip(sampled, forced)):
            ids[b, K - 1 - len(ff):] = torch.tensor([t, *ff])
            fed[b, K - 1 - len(ff):] = 1
        # a row's real tokens at its next positions; its pads at the first of them (masked, so any position works)
        pos = last_pos + (fed.cumsum(-1).clamp_min(1)).to(self.device)
        return ids.to(self.device), pos, fed.to(self.device)

    @torch.inference_mode()
    def _generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | None,
                  on_tokens: Callable[[list[int], list[int]], None] | None = None) -> list[Generation]:
        params = params or SamplingParams()
        self.calls += 1
        B = len(prompts)
        if B == 0:
            return []
        check_prompts(prompts, "HFEngine")
        max_new = int(params.max_new_tokens)
        greedy = bool(params.greedy) or params.temperature is None or params.temperature <= 0
        temperature = float(params.temperature) if params.temperature and params.temperature > 0 else 1.0
        stops = [s for s in (params.stop or []) if s]
        # A stop string of b bytes lies within its last b tokens plus one partial token at each end.
        stop_window = max((len(s.encode("utf-8")) for s in stops), default=0) + 2

        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        reasons: list[str] = ["length"] * B
        if max_new <= 0:
            return [Generation([], [], "", "length") for _ in range(B)]

        dev = self.device
        L = max(len(p) for p in prompts)
        input_ids = torch.full((B, L), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, L - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            attn[i, L - len(p):] = 1
        input_ids, attn = input_ids.to(dev), attn.to(dev)
        position_ids = (attn.cumsum(-1) - 1).clamp_min(0)

        rows = list(range(B))  # batch row -> output index, for the live rows
        hits = [self.prefix_cache.match(p) for p in prompts] if self.prefix_cache is not None else None
        cache, logits, attn = self._prefill(input_ids, attn, position_ids, prompts, hits)
        grammar = RowMatchers.start(self.grammars, params.constraint, B, logits.shape[-1])
        step_pos, kw = position_ids, self.cache_kw
        for step in range(max_new):
            if step and self.fast is not None:
                logits = self.fast.step(step_input, step_pos, attn, cache, steps_left=max_new - step)
            elif step:
                out = self.model(input_ids=step_input, attention_mask=attn, position_ids=step_pos, use_cache=True,
                                 logits_to_keep=1, **{kw: cache})
                cache = getattr(out, kw)
                logits = out.logits[:, -1, :].float()
            z = logits / temperature
            if grammar is not None:
                z = grammar.mask(z)  # forbidden tokens -inf: logp below is the masked, renormalised distribution
            logp = torch.log_softmax(z, dim=-1)
            if greedy:
                tokens = z.argmax(dim=-1)
            else:
                # Gumbel-max: argmax(z' + Gumbel noise) is an exact sample of softmax(z'), and cheaper than
                # torch.multinomial on a CPU.
                zf = filter_logits(z, int(params.top_k or 0), float(params.top_p))
                u = torch.rand(zf.shape, generator=self.generator, device=zf.device).clamp_(min=1e-20)
                tokens = (zf - torch.log(-torch.log(u))).argmax(dim=-1)
            token_lp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

            tok_list = tokens.tolist()
            lp_list = token_lp.tolist()
            keep: list[int] = []
            for r, (i, t, lp) in enumerate(zip(rows, tok_list, lp_list)):
                out_ids[i].append(t)
                out_lp[i].append(lp)
                if t in self.eos_token_ids:
                    reasons[i] = "stop"
                    continue
                if stops:
                    tail = self._decode_tail(out_ids[i][-stop_window:])
                    if any(s in tail for s in stops):
                        reasons[i] = "stop"
                        continue
                if len(out_ids[i]) < max_new:
                    keep.append(r)
            if on_tokens is not None:
                on_tokens(rows, tok_list)
            if self.prefix_cache is not None and len(keep) < len(rows):
                ended = sorted(set(range(len(rows))) - set(keep))
                self._remember(cache, attn, [(r, rows[r]) for r in ended], prompts, out_ids)
            if not keep:
                break
            forced = [[]] * len(keep)
            if grammar is not None:
                # tokens the grammar forces next (constrained.py, "Forced text"): room is left for one sampled
                # token after them, so a reply never ends on a token that was not fed back
                room = None if stops else [max_new - len(out_ids[rows[r]]) - 1 for r in keep]
                forced = grammar.advance(tok_list, keep, room)

            last_pos = step_pos[:, -1:]
            if len(keep) < len(rows):
                # Finished rows leave the batch, their KV-cache rows with them.
                idx = torch.as_tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(idx)
                attn = attn.index_select(0, idx)
                last_pos = last_pos.index_select(0, idx)
                rows = [rows[r] for r in keep]
            step_input, step_pos, fed = self._next_input([tok_list[r] for r in keep], forced, last_pos)
            attn = torch.cat([attn, fed], dim=1)
            if any(forced):
                for i, ff in zip(rows, forced):
                    out_ids[i] += ff
                    out_lp[i] += [0.0] * len(ff)  # each was the only token allowed
                if on_tokens is not None:
                    for j in range(max(map(len, forced))):
                        told = [(i, ff[j]) for i, ff in zip(rows, forced) if len(ff) > j]
                        on_tokens([i for i, _ in told], [t for _, t in told])

        gens = []
        for i in range(B):
            text = self.tokenizer.decode(out_ids[i], skip_special_tokens=True)
            gens.append(Generation(token_ids=out_ids[i], logprobs=out_lp[i], text=text, finish_reason=reasons[i]))
        return gens
