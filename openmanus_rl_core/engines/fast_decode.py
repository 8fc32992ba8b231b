"""One decoding step of a Llama-family model in plain torch calls, for the HF engine.

A decoding step feeds one token per row (several where a grammar forces text). For a small model on a CPU its
arithmetic is a few matrix-vector products, and the transformers forward around them (module calls, mask building, output classes, config lookups) costs
several times more: about 2.5 ms a step for the embedded 2-layer model at any small batch, of which the matrix
products are 0.2 ms. Episodes on their own (``rollout.mode=episodes``, the group stream) generate for the few
episodes ready at a time, so that overhead is most of their generation.

:class:`FastDecode` runs the same step from the model's own weights and modules: RMS norm, the q/k/v projections
(with their biases), the model's rotary embedding, one scaled-dot-product attention over the KV cache with the
padding mask, the output projection, the gated MLP, the final norm and the LM head. The cache is the prefill's
``DynamicCache``. The model's own layers extend it with ``torch.cat``, which copies every column at every step;
here each layer's keys and values live in a longer tensor (a slab) with room for the call's remaining steps, each
step writes its one column in place, and the cache layer holds a view of the filled columns. Anything that replaces
the cache's tensors (finished rows leaving the batch) is noticed, and the next step copies them into a new slab. A
cache without per-layer tensors (older transformers) is extended through its ``update``. The logits are those of
the model's forward up to float rounding (``tests/test_fast_decode.py``).

Only architectures whose decoder layer is exactly that take this path (:data:`ARCHITECTURES`, full attention, no
sliding window); any other model decodes through its own forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["ARCHITECTURES", "FastDecode"]

# model_type -> the decoder layer this module reproduces (pre-norm attention and gated MLP, rotary positions).
ARCHITECTURES = ("qwen2", "llama")


class FastDecode:
    """The decoding step of ``model`` (see the module doc); build it with :meth:`for_model`."""

    def __init__(self, model: Any):
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm
        self.lm_head = model.lm_head
        self.layers = list(inner.layers)
        self.fused: list | None = None
        self.slabs: list[tuple[torch.Tensor, torch.Tensor] | None] = []  # per layer: keys, values with room to grow

    def release(self) -> None:
        """Forget the fused weights (the model's weights changed, or its memory is being freed); the next
        :meth:`step` reads them again."""
        self.fused = None
        self.finish()

    def finish(self) -> None:
        """Drop the slabs (a generate call is over, so its cache's memory goes with it)."""
        self.slabs = []

    def _append(self, cache: Any, i: int, k: torch.Tensor, v: torch.Tensor,
                steps_left: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``cache``'s layer ``i`` with this step's ``k`` and ``v`` ``[B, heads, K, d]`` appended, written in place
        into its slab (room for ``steps_left`` more columns, at least these); the layer's keys and values become
        views of the slab."""
        layers = getattr(cache, "layers", None)
        if layers is None:
            return cache.update(k, v, i)
        layer = layers[i]
        keys, values = layer.keys, layer.values
        n, K = keys.shape[2], k.shape[2]
        slab = self.slabs[i] if i < len(self.slabs) else None
        if (slab is None or slab[0].shape[2] < n + K or slab[0].data_ptr() != keys.data_ptr()
                or slab[0].stride() != keys.stride() or slab[1].data_ptr() != values.data_ptr()):
            # a new cache, finished rows dropped from it, or no room left: copy its columns into a new slab
            room = n + max(K, steps_left)
            slab = (keys.new_empty(keys.shape[0], keys.shape[1], room, keys.shape[3]),
                    values.new_empty(values.shape[0], values.shape[1], room, values.shape[3]))
            slab[0][:, :, :n] = keys
            slab[1][:, :, :n] = values
            self.slabs += [None] * (i + 1 - len(self.slabs))
            self.slabs[i] = slab
        slab[0][:, :, n:n + K] = k
        slab[1][:, :, n:n + K] = v
        layer.keys, layer.values = slab[0][:, :, :n + K], slab[1][:, :, :n + K]
        return layer.keys, layer.values

    def _fuse(self) -> list:
        """q, k and v of each layer as one matrix product, and the MLP's gate and up as another."""
        fused = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = [a.q_proj, a.k_proj, a.v_proj]
            bias = None if any(p.bias is None for p in qkv) else torch.cat([p.bias for p in qkv])
            fused.append((torch.cat([p.weight for p in qkv]), bias, [p.weight.shape[0] for p in qkv],
                          torch.cat([m.gate_proj.weight, m.up_proj.weight]), a.head_dim, a.scaling))
        return fused

    @classmethod
    def for_model(cls, model: Any) -> "FastDecode | None":
        """A :class:`FastDecode` when ``model`` is one of :data:`ARCHITECTURES` as this module reads it, else None."""
        cfg = getattr(model, "config", None)
        if getattr(cfg, "model_type", None) not in ARCHITECTURES or not hasattr(model, "lm_head"):
            return None
        if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "pretraining_tp", 1) != 1:
            return None
        if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
            return None
        if getattr(cfg, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
            return None
        try:
            layers = list(model.model.layers)
            for layer in layers:
                a, m = layer.self_attn, layer.mlp
                linears = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
                _ = (a.scaling, a.head_dim, m.act_fn, layer.input_layernorm.variance_epsilon,
                     layer.post_attention_layernorm.variance_epsilon)
                if hasattr(a, "q_norm") or hasattr(a, "k_norm"):
                    return None
                if len({a.q_proj.bias is None, a.k_proj.bias is None, a.v_proj.bias is None}) != 1:
                    return None  # q, k and v fuse into one product only with all or none of their biases
                if not all(type(p) is torch.nn.Linear for p in (*linears, model.lm_head)):
                    return None  # adapters, quantized layers: the model's own forward knows them
            return cls(model)
        except AttributeError:
            return None

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any,
             steps_left: int) -> torch.Tensor:
        """The next-token logits ``[B, V]`` (float32) after ``tokens`` ``[B, K]`` at ``positions`` ``[B, K]`` (K is 1
        but where a grammar forced tokens: ``engines/constrained.py``); ``mask`` ``[B, T]``: which of the cache's
        columns (these K the last) each row attends to, a token seeing only the columns before it and itself.
        Appends each layer's new keys and values to ``cache`` (a ``DynamicCache``); ``steps_left``: the columns this
        call may still add, these included (the slabs' room; more are made if needed)."""
        if self.fused is None:
            self.fused = self._fuse()
        B, K = tokens.shape
        h = F.embedding(tokens, self.embed.weight)
        cos, sin = self.rotary(h, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        allowed = mask.bool()[:, None, None, :]
        if K > 1:  # causal within the new columns, and one row of the mask per query head of a key/value head
            T, (q_out, k_out, _) = mask.shape[1], self.fused[0][2]
            group = q_out // k_out
            allowed = (allowed & torch.ones(K, T, dtype=torch.bool, device=mask.device).tril(T - K)).expand(
                B, group, K, T).reshape(B, 1, group * K, T)
        for i, (layer, (w_qkv, b_qkv, split, w_gate_up, head_dim, scaling)) in enumerate(zip(self.layers, self.fused)):
            a, m = layer.self_attn, layer.mlp
            x = _rms(h, layer.input_layernorm)
            q, k, v = F.linear(x, w_qkv, b_qkv).view(B, K, -1, head_dim).permute(2, 0, 1, 3).split(
                [n // head_dim for n in split], dim=0)
            # [heads, B, K, d] -> [B, heads, K, d]; q and k rotated together
            qk = _rotate(torch.cat([q, k]).transpose(0, 1), cos, sin)
            q, k = qk[:, :q.shape[0]], qk[:, q.shape[0]:]
            keys, values = self._append(cache, i, k, v.transpose(0, 1), steps_left)
            # Grouped-query attention: the query heads that share a key/value head are stacked as that head's
            # query rows ([B, kv heads, group * K, d]), so the keys and values are not repeated per query head.
            o = F.scaled_dot_product_attention(q.reshape(B, keys.shape[1], -1, head_dim), keys, values,
                                               attn_mask=allowed, scale=scaling)
            o = o.view(B, q.shape[1], K, head_dim).transpose(1, 2).reshape(B, K, -1)
            h = h + _linear(o, a.o_proj)
            gate, up = F.linear(_rms(h, layer.post_attention_layernorm), w_gate_up).chunk(2, dim=-1)
            h = h + _linear(m.act_fn(gate) * up, m.down_proj)
        return _linear(_rms(h[:, -1:], self.norm), self.lm_head)[:, -1, :].float()

def _rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """The model's RMS norm: in float32, the weight applied in the input's dtype."""
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions: ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _linear(x: torch.Tensor, layer: Any) -> torch.Tensor:
    """``layer(x)`` for an ``nn.Linear`` without the module call's overhead."""
    return F.linear(x, layer.weight, layer.bias)
