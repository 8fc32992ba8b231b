"""The HF engine's prefix cache: the keys and values of earlier sequences, found again by their tokens.

In a multi-turn episode each turn's prompt is the last turn's prompt, the reply, and the env's answer. Without a
cache every turn prefills the whole context again, and on a CPU that prefill costs more than the reply's
decoding. :class:`PrefixCache` keeps, for each sequence a ``generate`` call finished, the KV-cache rows of its
tokens (prompt and reply but the reply's last token, which was sampled and never fed back); the next call looks
each prompt up and prefills only the part after the longest cached prefix (``HFEngine._prefill_cached``).

- **Lookup** walks the prompt in blocks of :data:`BLOCK` tokens, each block's key chained to the ones before it
  (a prefix's KV depends only on that prefix's tokens), then compares the found entry's tokens one by one: a hit
  is always verified, and it may end inside a block. At least one prompt token is left to prefill, so the
  next-token logits come from this call's forward.
- **One entry per live sequence:** a new entry that extends an older one (the next turn of the same episode)
  replaces it.
- **Bounded:** entries are evicted least recently used first once their tensors pass ``max_bytes``.
- **Never stale:** the engine clears the cache when its weights change (keys and values of older weights are
  another policy's) and when it sleeps; a lockstep rollout clears it when it starts, so what a call computes
  depends only on the rollout it belongs to (a resumed run samples what an uninterrupted one does).

The cached keys and values are those the earlier call computed, so a hit gives the result of prefilling the
whole prompt up to the float rounding of a different batch shape (``tests/test_prefix_cache.py`` compares).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["BLOCK", "Entry", "PrefixCache"]

# Tokens per lookup block: a longer block means fewer dictionary probes, a shorter one finer sharing between
# sequences that are not one another's prefix (the rest of a hit is found token by token within the entry).
BLOCK = 16


@dataclass
class Entry:
    """One cached sequence: its ``tokens`` and, per layer, keys and values ``[kv_heads, len(tokens), head_dim]``."""

    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    keys: list[int] = field(default_factory=list)  # its block keys, for eviction
    nbytes: int = 0


def _block_keys(tokens: Sequence[int], limit: int) -> list[int]:
    """The chained keys of the whole blocks within ``tokens[:limit]``."""
    keys, h = [], 0
    for start in range(0, limit - BLOCK + 1, BLOCK):
        h = hash((h, tuple(tokens[start:start + BLOCK])))
        keys.append(h)
    return keys


class PrefixCache:
    """See the module doc. ``max_bytes``: the most bytes of keys and values kept."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # id -> entry, least recently used first
        self.index: dict[int, dict[int, None]] = {}  # block key -> ids of the entries holding that prefix
        self.nbytes = 0
        self.next_id = 0
        self.hit_tokens = 0  # prompt tokens found in the cache, since construction (metrics, tests)
        self.prompt_tokens = 0  # prompt tokens looked up

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self.index.clear()
        self.nbytes = 0

    def match(self, prompt: Sequence[int]) -> tuple[Entry | None, int]:
        """The entry holding the longest prefix of ``prompt`` and that prefix's length (at most ``len - 1``);
        ``(None, 0)`` when none is cached."""
        self.prompt_tokens += len(prompt)
        tokens = list(prompt)
        eid, k = self._find(tokens, _block_keys(tokens, len(tokens) - 1), len(tokens) - 1)
        if eid is None:
            return None, 0
        self.entries.move_to_end(eid)
        self.hit_tokens += k
        return self.entries[eid], k

    def _find(self, tokens: list[int], keys: list[int], limit: int) -> tuple[int | None, int]:
        """The newest entry holding the most whole blocks of ``tokens`` (``keys``: their block keys within
        ``tokens[:limit]``), and how many of its tokens match (the blocks compared token by token, then a partial
        block)."""
        found, m = None, 0
        for n, key in enumerate(keys, start=1):
            ids = self.index.get(key)
            if not ids:
                break
            found, m = next(reversed(ids)), n * BLOCK
        if found is None:
            return None, 0
        cached = self.entries[found].tokens
        if cached[:m] != tokens[:m]:  # a key collision
            return None, 0
        end = min(limit, len(cached))
        while m < end and cached[m] == tokens[m]:
            m += 1
        return found, m

    def add(self, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep ``tokens`` with their keys and values (one ``(keys, values)`` per layer, ``[kv_heads, len(tokens),
        head_dim]``, owned by the cache from now on). An entry whose tokens are a prefix of these goes."""
        if len(tokens) < BLOCK:
            return
        keys = _block_keys(tokens, len(tokens))
        eid, k = self._find(tokens, keys, len(tokens))
        if eid is not None and k == len(self.entries[eid].tokens):
            self._evict(eid)  # the same sequence, a turn ago
        entry = Entry(tokens=tokens, kv=kv, keys=keys,
                      nbytes=sum(t.numel() * t.element_size() for pair in kv for t in pair))
        if entry.nbytes > self.max_bytes:
            return
        eid, self.next_id = self.next_id, self.next_id + 1
        self.entries[eid] = entry
        for key in keys:
            self.index.setdefault(key, {})[eid] = None
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self._evict(next(iter(self.entries)))

    def _evict(self, eid: int) -> None:
        entry = self.entries.pop(eid)
        self.nbytes -= entry.nbytes
        for key in entry.keys:
            ids = self.index.get(key)
            if ids is not None:
                ids.pop(eid, None)
                if not ids:
                    del self.index[key]
