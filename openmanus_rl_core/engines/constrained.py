"""Grammar-constrained decoding: a :class:`~openmanus_rl_core.protocols.Constraint` as a per-row token mask.

The grammar library is llguidance (PyPI ``llguidance``), chosen over xgrammar and outlines-core because:

- it installs here as one 3 MB abi3 wheel with no dependencies (xgrammar 0.2.8 pulls triton and apache-tvm-ffi;
  outlines-core turns a JSON schema into a regular expression and indexes it over the whole vocabulary: no
  context-free grammars, so recursive schemas and arbitrarily nested ``json_object`` replies are cut to a fixed
  depth, and each new schema costs a pass over the vocabulary);
- it reads a Hugging Face fast tokenizer's byte-level BPE directly (``llguidance.hf.from_tokenizer``), special
  and added tokens included;
- one grammar language covers everything the gateway needs: JSON schemas, and Lark grammars that embed a JSON
  schema (``%json {...}``), which is how a tool call's wrapper (``<tool_call>\\n ... \\n</tool_call>``) goes around
  ``{"name": ..., "arguments": ...}``;
- its mask is computed per step from the grammar and a token trie, with no per-grammar pass over the vocabulary:
  about 13 us a step for one row here (mask and advance, a 440-token BPE), and a new schema (every request may
  bring one) compiles in milliseconds;
- vLLM ships it as its ``guidance`` structured-outputs backend, so ``hf`` and ``vllm`` run the same grammar
  (:func:`to_lark`) through the same library.

How a row is decoded (``engines/hf.py``): before each sampled token the row's matcher writes the set of tokens
the grammar allows into a bitmask; the other logits become ``-inf``, so the token is drawn from the model's
distribution renormalised over the allowed tokens, and its recorded log-probability is that of the masked,
renormalised distribution (``log_softmax`` over the allowed tokens, temperature applied first). The matcher then
consumes the token. EOS is allowed exactly where the grammar may end; where it must end, EOS is the only token
allowed (log-probability 0), and the row ends there like any reply.

Forced text: where the grammar allows one text only (a key with its quotes, the one tool's name, the closing
brace), llguidance's mask allows that text's own tokens only, one at a time, each then recorded with log-probability
0. Right after a sampled token the matcher names those tokens (``compute_ff_tokens``) and consumes them; the engine
appends them to the reply at once and feeds them with the sampled token in one forward pass of several positions,
in place of one pass each. The tokens and log-probabilities are those of the one-at-a-time loop (each was the only
token allowed; ``tests/test_constrained.py``); only the random draws the loop would have spent on them are not
spent, so a seeded reply differs from that loop's after its first forced stretch. In ``bench/constrained.py``'s
schema about two thirds of a reply's tokens are forced. A call with stop strings takes forced tokens one at a time
(stop strings are checked token by token).

JSON is written compactly with ``json.dumps``'s default separators (:data:`JSON_FORMAT`): no free whitespace, so a
model cannot fill its budget with spaces between tokens, and a tool call reads as the canonical text the rest of
the project writes. Strings and numbers are as long as the schema lets them be: give ``maxLength`` /
``maximum`` where a short reply matters.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from openmanus_rl_core.protocols import Constraint

__all__ = ["JSON_FORMAT", "ToolCallFormat", "HERMES", "json_schema_constraint", "json_object_constraint",
           "tool_call_constraint", "any_of", "one_of", "to_lark", "grammar_error", "Grammars", "RowMatchers",
           "per_row", "pass_width", "allowed_tokens"]

log = logging.getLogger(__name__)

# llguidance's JSON options: json.dumps's default separators, nothing else between tokens.
JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ToolCallFormat:
    """How a model family writes tool calls around the JSON object ``{"name": ..., <arguments_key>: {...}}``:
    ``prefix`` before each call, ``suffix`` after it, ``separator`` between two calls, ``opening`` and ``closing``
    around all of them (Mistral: ``[TOOL_CALLS][`` and ``]`` around calls separated by ``", "``). Text, matched
    byte for byte: an added token whose text it is (Qwen's ``<tool_call>``) may be sampled for it, but a control
    token that only a tokenizer's special-token path produces is not reached this way."""

    prefix: str = "<tool_call>\n"
    suffix: str = "\n</tool_call>"
    separator: str = "\n"
    arguments_key: str = "arguments"
    opening: str = ""
    closing: str = ""


HERMES = ToolCallFormat()
"""Hermes, Qwen2.5 and Qwen3 (and the embedded default): ``<tool_call>\\n{json}\\n</tool_call>``, one per line."""


def _with_format(schema: Mapping[str, Any]) -> dict[str, Any]:
    closed = _closed(schema)
    return {**closed, "x-guidance": {**JSON_FORMAT, **dict(schema.get("x-guidance") or {})}}


_SUBSCHEMAS = ("items", "additionalItems", "not", "if", "then", "else", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def _closed(schema: Any) -> Any:
    """``schema`` with every object that lists ``properties`` and says nothing of ``additionalProperties`` closed to
    other keys (as vLLM's guidance backend does): JSON Schema admits undeclared keys by default, and a model's
    string under such a key may run to the length cap. An object with no ``properties`` (``json_object``) stays
    open."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = _closed(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(s) for s in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: _closed(v) for k, v in out[key].items()}
    if isinstance(out.get("additionalProperties"), Mapping):
        out["additionalProperties"] = _closed(out["additionalProperties"])
    return out


def _lark_str(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def json_schema_constraint(schema: Mapping[str, Any], name: str = "json_schema") -> Constraint:
    """The reply is one JSON value valid against ``schema``."""
    return Constraint(json_schema=dict(schema), name=name)


def json_object_constraint() -> Constraint:
    """The reply is one JSON object (OpenAI's ``response_format={"type": "json_object"}``)."""
    return Constraint(json_schema={"type": "object"}, name="json_object")


def _call_schema(tools: Sequence[Mapping[str, Any]], arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call of any of ``tools`` (``{"name", "parameters"}`` each)."""
    alts = []
    for tool in tools:
        params = tool.get("parameters") or {"type": "object", "properties": {}}
        alts.append({"type": "object", "properties": {"name": {"const": tool["name"]}, arguments_key: params},
                     "required": ["name", arguments_key], "additionalProperties": False})
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def _seq(*parts: str) -> str:
    """A Lark sequence of literal texts and rule names (``"..."`` parts are literals); empty literals left out."""
    return " ".join(p for p in parts if p and p != '""')


def _calls_rule(tools: Sequence[Mapping[str, Any]], fmt: ToolCallFormat, parallel: bool) -> tuple[str, str]:
    """``(expression, rules)``: one call (or, ``parallel``, one or more) of ``tools`` in ``fmt``."""
    if not tools:
        raise ValueError("a tool-call constraint needs at least one tool")
    body = json.dumps(_with_format(_call_schema(tools, fmt.arguments_key)), ensure_ascii=False)
    more = f"({_seq(_lark_str(fmt.separator), 'call')})*" if parallel else ""
    rules = (f"calls: {_seq(_lark_str(fmt.opening), 'call', more, _lark_str(fmt.closing))}\n"
             f"call: {_seq(_lark_str(fmt.prefix), 'call_json', _lark_str(fmt.suffix))}\n"
             f"call_json: %json {body}\n")
    return "calls", rules


def tool_call_constraint(tools: Sequence[Mapping[str, Any]], fmt: ToolCallFormat = HERMES,
                         parallel: bool = False) -> Constraint:
    """The reply is one tool call (``parallel``: one or more) of one of ``tools`` and nothing else, each call
    ``fmt.prefix + {"name": <a tool's name>, "arguments": <valid against that tool's parameters>} + fmt.suffix``.

    ``tools``: ``{"name": str, "parameters": JSON schema}`` each (OpenAI's ``function`` object)."""
    expr, rules = _calls_rule(tools, fmt, parallel)
    names = ",".join(t["name"] for t in tools)
    return Constraint(lark=f"start: {expr}\n{rules}", name=f"tool_call:{names}")


def any_of(tools: Sequence[Mapping[str, Any]], schema: Mapping[str, Any], fmt: ToolCallFormat = HERMES,
           parallel: bool = False) -> Constraint:
    """Either tool call(s) as :func:`tool_call_constraint` or one JSON value of ``schema`` (``tool_choice=auto``
    with a response format: the model answers or calls a tool, both in form)."""
    expr, rules = _calls_rule(tools, fmt, parallel)
    body = json.dumps(_with_format(schema), ensure_ascii=False)
    return Constraint(lark=f"start: {expr} | answer\n{rules}answer: %json {body}\n", name="tool_call_or_json")


def one_of(texts: Sequence[str], name: str = "one_of") -> Constraint:
    """The reply is exactly one of ``texts``, byte for byte (an env's legal actions, each as its template writes
    it: ``rollout/choices.py``)."""
    if not texts:
        raise ValueError("a one_of constraint needs at least one text")
    return Constraint(lark=f"start: {' | '.join(_lark_str(t) for t in dict.fromkeys(texts))}\n", name=name)


def to_lark(constraint: Constraint) -> str:
    """The constraint as one Lark grammar (llguidance's dialect), for llguidance here and vLLM's ``guidance``
    backend."""
    if constraint.lark is not None:
        return constraint.lark
    return f"start: %json {json.dumps(_with_format(constraint.json_schema), ensure_ascii=False)}\n"


def _grammar(constraint: Constraint) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_lark(to_lark(constraint))


def grammar_error(constraint: Constraint) -> str | None:
    """Why ``constraint`` cannot be compiled (a bad grammar, a schema llguidance does not support), or None."""
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(_grammar(constraint))
    return error.strip().splitlines()[0] if error else None


def per_row(constraint: Constraint | Sequence[Constraint | None] | None, rows: int) -> list[Constraint | None]:
    """``SamplingParams.constraint`` as one entry per prompt."""
    if constraint is None or isinstance(constraint, Constraint):
        return [constraint] * rows
    out = list(constraint)
    if len(out) != rows:
        raise ValueError(f"SamplingParams.constraint has {len(out)} entries for {rows} prompts; give one per prompt, "
                         "or one Constraint for all")
    bad = [c for c in out if c is not None and not isinstance(c, Constraint)]
    if bad:
        raise ValueError(f"SamplingParams.constraint entries must be Constraint or None, not {bad[0]!r}")
    return out


class Grammars:
    """An engine's grammar compiler: its tokenizer as llguidance sees it (built once per vocabulary width) and the
    last ``capacity`` compiled grammars (a GRPO group's rows, and every turn of an agent with one schema, share one).

    ``tokenizer``: a Hugging Face fast tokenizer; ``eos_token_ids``: every token that ends a reply."""

    def __init__(self, tokenizer: Any, eos_token_ids: Iterable[int], capacity: int = 64):
        self.tokenizer = tokenizer
        self.eos_token_ids = sorted(int(i) for i in eos_token_ids)
        self.capacity = int(capacity)
        self._lltok: dict[int, Any] = {}
        self._compiled: OrderedDict[tuple[int, str], Any] = OrderedDict()

    def _ll_tokenizer(self, vocab: int) -> Any:
        if vocab not in self._lltok:
            import llguidance.hf

            if not self.eos_token_ids:
                raise ValueError("constrained decoding needs an EOS token: the tokenizer and the model's generation "
                                 "config name none")
            # n_vocab = the logits' width: a model's embedding may be wider than its tokenizer, and those extra
            # ids are never allowed.
            self._lltok[vocab] = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=vocab,
                                                              eos_token=self.eos_token_ids)
        return self._lltok[vocab]

    def matcher(self, constraint: Constraint, vocab: int) -> Any:
        """A fresh ``llguidance.LLMatcher`` of ``constraint`` over a ``vocab``-wide vocabulary; a grammar that
        does not compile raises ValueError naming the constraint and the error."""
        from llguidance import LLMatcher

        grammar = _grammar(constraint)
        key = (vocab, grammar)
        proto = self._compiled.get(key)
        if proto is None:
            proto = LLMatcher(self._ll_tokenizer(vocab), grammar, log_level=0)
            if proto.is_error():
                raise ValueError(f"constraint {constraint.name or 'unnamed'!r} does not compile: "
                                 f"{proto.get_error().strip().splitlines()[0]}")
            self._compiled[key] = proto
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        return proto.deep_copy()


class RowMatchers:
    """The matchers of one batched decoding loop: one per live row (None: unconstrained), in the batch's row order.

    Per step: :meth:`mask` before sampling; :meth:`advance` after it, with the rows that go on. ``advance`` consumes
    the sampled tokens and the text the grammar then forces, and computes the next masks at once, before the
    model's next step (right after its token, a matcher's state is still in the processor's cache). All on the
    calling thread: computing the next masks on a second thread while the model computes the next logits
    (llguidance drops the GIL) was measured slower here, on 2 cores, at batch 1 and 8 (the hand-over costs more than
    the 6 us a row the mask takes on the embedded default's vocabulary)."""

    def __init__(self, grammars: Grammars, constraints: Sequence[Constraint | None], vocab: int):
        import numpy as np

        self.vocab = int(vocab)
        self.eos = list(grammars.eos_token_ids)
        self.matchers = [None if c is None else grammars.matcher(c, self.vocab) for c in constraints]
        words = (self.vocab + 31) // 32
        n = sum(m is not None for m in self.matchers)
        # Reused every step: llguidance writes each row's bitmask (1 = allowed, little-endian bits) into ``bits``;
        # a byte -> 8 "forbidden" flags table unpacks it into ``forbid``, which torch reads as bool without a copy.
        self._bits = np.empty((n, words), dtype=np.int32)
        self._bytes = self._bits.view(np.uint8)
        self._flags = np.empty((n, words * 4, 8), dtype=np.uint8)
        self._table = 1 - np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
        self._forbid = torch.from_numpy(self._flags).view(n, words * 32).view(torch.bool)
        self._targets: list[tuple[int, Any, int]] = []
        self._aim()
        self._compute()

    def _aim(self) -> None:
        """Where each constrained row's mask goes: ``(batch row, matcher, address in bits)``."""
        nbytes, ptr = self._bits.shape[1] * 4, self._bits.ctypes.data
        rows = [(r, m) for r, m in enumerate(self.matchers) if m is not None]
        self._targets = [(r, m, ptr + i * nbytes) for i, (r, m) in enumerate(rows)]
        n = len(rows)
        self._rows = [r for r, _ in rows]
        self._src, self._dst, self._view = self._bytes[:n], self._flags[:n], self._forbid[:n, :self.vocab]

    @classmethod
    def start(cls, grammars: Grammars | None, constraint: Any, rows: int, vocab: int) -> "RowMatchers | None":
        """The call's matchers, or None when no row is constrained."""
        constraints = per_row(constraint, rows)
        if all(c is None for c in constraints):
            return None
        if grammars is None:
            raise ValueError("this engine's tokenizer is not a Hugging Face fast tokenizer: constrained decoding "
                             "needs one")
        return cls(grammars, constraints, vocab)

    def _compute(self) -> None:
        """Each constrained row's bitmask for its next token, into ``bits``."""
        nbytes = self._bits.shape[1] * 4
        # One matcher at a time: measured faster here than llguidance's parallel executor for a batch of 8
        # (49 against 64 us a step), whose threads cost more than they save on small grammars.
        for _, m, ptr in self._targets:
            m.unsafe_compute_mask_ptr(ptr, nbytes)

    def _forbidden(self) -> tuple[list[int], torch.Tensor]:
        """``(constrained rows, forbidden [n, vocab] bool)`` for the next token (a view of a buffer the next call
        overwrites). A row whose grammar allows nothing (a dead grammar) may only end: EOS."""
        self._table.take(self._src, axis=0, out=self._dst)
        forbid = self._view
        for i, (_, m, _) in enumerate(self._targets):
            if m.is_error():  # a matcher in error allows no token
                log.warning("constrained decoding: the grammar failed (%s); the reply ends", m.get_error())
                forbid[i, self.eos] = False
        return self._rows, forbid

    def mask(self, z: torch.Tensor) -> torch.Tensor:
        """``z`` [B, V] with the tokens each constrained row's grammar forbids set to ``-inf``, in place
        (unconstrained rows unchanged)."""
        rows, forbid = self._forbidden()
        if not rows:
            return z
        if forbid.device != z.device:
            forbid = forbid.to(z.device, non_blocking=True)
        if len(rows) == z.shape[0]:
            return z.masked_fill_(forbid, float("-inf"))
        idx = torch.as_tensor(rows, dtype=torch.long, device=z.device)
        z[idx] = z[idx].masked_fill(forbid, float("-inf"))
        return z

    def advance(self, tokens: Sequence[int], keep: Sequence[int],
                room: Sequence[int] | None = None) -> list[list[int]]:
        """The rows ``keep`` (in that order) go on after sampling ``tokens`` (one per current row): their matchers
        consume their tokens. Returns, per kept row, the tokens its grammar forces next that the engine feeds with
        the sampled one (at most ``room[j]`` for kept row ``j``; none when ``room`` is None), already consumed (see
        the module doc, "Forced text", and :func:`pass_width`)."""
        if len(keep) != len(self.matchers):
            self.matchers = [self.matchers[r] for r in keep]
            self._aim()
        forced: list[list[int]] = []
        for j, (m, r) in enumerate(zip(self.matchers, keep)):
            if m is not None and not m.consume_token(int(tokens[r])):
                # the token was drawn from the mask, so this is a bug, not a model's mistake
                raise RuntimeError(f"constrained decoding: the grammar refused sampled token {tokens[r]}: "
                                   f"{m.get_error()}")
            forced.append(m.compute_ff_tokens()[:room[j]] if m is not None and room is not None and room[j] > 0
                          else [])
        if any(forced):
            width = pass_width([len(f) for f in forced])
            forced = [f[:width - 1] for f in forced]
            for m, ff in zip(self.matchers, forced):
                if ff and not m.consume_tokens(ff):
                    raise RuntimeError(f"constrained decoding: the grammar refused its own forced tokens {ff}: "
                                       f"{m.get_error()}")
        self._compute()
        return forced


def allowed_tokens(grammars: Grammars, constraint: Constraint, token_ids: Sequence[int], vocab: int) -> list[list[int]]:
    """The tokens ``constraint``'s grammar allowed before each of ``token_ids``, a reply decoded under it: the
    engine's masks, replayed through llguidance (any engine's reply; a forced token's list is that token alone).
    ``vocab``: the width of the masks (at least the tokenizer's)."""
    rows = RowMatchers(grammars, [constraint], vocab)
    out = []
    for t in token_ids:
        _, forbid = rows._forbidden()
        out.append(torch.nonzero(~forbid[0]).flatten().tolist())
        rows.advance([int(t)], [0])
    return out


def pass_width(forced: Sequence[int]) -> int:
    """How many positions each row feeds in the next pass, given each row's count of forced tokens after its sampled
    one: the most for which at least three quarters of the pass's positions are real tokens, not padding. One row
    feeds all of its forced text. In a batch a pass costs about its rows times its width once the model is large
    enough to be bound by arithmetic (31M parameters on a CPU); a row whose forced text is cut here is forced again
    at its next step. Three quarters was the fastest of a half, three quarters and all, at 31M, in a greedy batch
    of 8 under ``bench/constrained.py``'s schema (a scratch comparison, beside another run; the bench's batch
    column is the kept measure)."""
    width = 1
    for k in range(2, max(forced) + 2):
        if 4 * sum(min(1 + f, k) for f in forced) < 3 * len(forced) * k:
            break
        width = k
    return width
