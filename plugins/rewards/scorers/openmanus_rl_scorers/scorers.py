"""Function-style scorers: ``compute_score(solution_str, ground_truth, **kwargs) -> float | dict``.

Each is registered directly under ``openmanus_rl.rewards`` (no class around it); the reward composer wraps it
in :class:`~openmanus_rl_core.rewards.components.FunctionReward`, which passes the trajectory's last reply as
``solution_str``, the task row's ``ground_truth`` (or ``reward_model.ground_truth``), the row's other fields
and the configured ``kwargs``. Select one in a reward config::

    components:
      answer: {name: math_answer, weight: 1.0, kwargs: {rel_tol: 1.0e-4}}

==================  ===========================================================  =========  =========================
name                value                                                        range      extra metrics (dict form)
==================  ===========================================================  =========  =========================
``exact_match``     1 if ``normalize(answer) == normalize(reference)``           {0, 1}     --
``token_f1``        SQuAD token F1 of the normalised answer and reference        [0, 1]     ``precision``, ``recall``
``bleu``            sacrebleu sentence BLEU / 100 (13a tokens, exp smoothing)    [0, 1]     ``brevity_penalty``
``math_answer``     1 if the answer's number equals the reference's              [0, 1]     ``answer_found``
                    (``format_score`` when a number was found but is wrong)
==================  ===========================================================  =========  =========================

Which text is scored: with ``answer_from="action"`` (the default) and a trajectory at hand, the content the
template parsed out of the last reply (``<action>42</action>`` -> ``42``), so template markup never counts
against the answer; when that reply did not parse, or with ``answer_from="response"``, or when a scorer is
called directly without a trajectory, ``solution_str`` itself.

Several references: the text scorers accept a list/tuple of references and return the best score over them
(SQuAD's ``metric_max_over_ground_truths``; BLEU scores against all references at once, as sacrebleu does).

Bad ground truths raise ``TypeError`` (wrong type: a dict, a bool, ...) or ``ValueError`` (missing, or for
``math_answer`` not a number), naming the scorer and the value. The composer turns that into 0 for the sample,
counts it in ``reward/<label>/errors`` and logs the first message with the task id.
"""

from __future__ import annotations

import math
import numbers
import re
import string
from collections import Counter
from fractions import Fraction
from functools import lru_cache
from typing import Any, Sequence

__all__ = [
    "exact_match",
    "token_f1",
    "bleu",
    "math_answer",
    "normalize_answer",
    "extract_number",
    "parse_number",
]

_ANSWER_FROM = ("action", "response")


# -------------------------------------------------------------------------------------------- helpers
def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace.

    ``"The  Cat, sat!"`` -> ``"cat sat"``.
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_PUNCT = frozenset(string.punctuation)


def _answer_text(scorer: str, solution_str: Any, trajectory: Any, answer_from: str) -> str:
    """The text a scorer reads: the last turn's parsed action, or the raw reply (see the module docstring)."""
    if answer_from not in _ANSWER_FROM:
        raise ValueError(f"{scorer}: answer_from={answer_from!r}; valid values are {list(_ANSWER_FROM)}")
    if answer_from == "action" and trajectory is not None and getattr(trajectory, "turns", None):
        action = trajectory.turns[-1].action
        if getattr(action, "valid", False):
            return str(action.content)
    if solution_str is None:
        return ""
    if not isinstance(solution_str, str):
        raise TypeError(f"{scorer}: solution_str must be a string, got {type(solution_str).__name__} {solution_str!r}")
    return solution_str


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _references(scorer: str, ground_truth: Any) -> list[str]:
    """A text scorer's references: a string, a number (as text), or a non-empty list/tuple of those."""
    if ground_truth is None:
        raise ValueError(
            f"{scorer}: the task has no ground truth (None); give the task rows a 'ground_truth' column "
            "(or reward_model.ground_truth)"
        )
    if isinstance(ground_truth, str):
        return [ground_truth]
    if _is_number(ground_truth):
        return [_number_text(ground_truth)]
    if isinstance(ground_truth, (list, tuple)):
        if not ground_truth:
            raise ValueError(f"{scorer}: ground truth is an empty {type(ground_truth).__name__}; give at least one reference")
        bad = [g for g in ground_truth if not (isinstance(g, str) or _is_number(g))]
        if bad:
            raise TypeError(
                f"{scorer}: ground truth {ground_truth!r} holds {type(bad[0]).__name__} {bad[0]!r}; "
                "references must be strings or numbers"
            )
        return [g if isinstance(g, str) else _number_text(g) for g in ground_truth]
    raise TypeError(
        f"{scorer}: ground truth must be a string, a number or a list of strings, got "
        f"{type(ground_truth).__name__} {ground_truth!r}"
    )


def _number_text(x: numbers.Real) -> str:
    """``42.0`` -> ``"42"``, ``0.5`` -> ``"0.5"``: how a number reads as a reference answer."""
    if isinstance(x, numbers.Integral):
        return str(int(x))
    f = float(x)
    return str(int(f)) if f.is_integer() else repr(f)


# ------------------------------------------------------------------------------------------ exact match
def exact_match(solution_str: str, ground_truth: Any, answer_from: str = "action", trajectory: Any = None,
                **kwargs: Any) -> float:
    """1.0 if the normalised answer equals a normalised reference (:func:`normalize_answer`), else 0.0.

    ``exact_match("The Eiffel Tower!", "eiffel tower") == 1.0``.
    """
    refs = _references("exact_match", ground_truth)
    answer = normalize_answer(_answer_text("exact_match", solution_str, trajectory, answer_from))
    return 1.0 if any(answer == normalize_answer(r) for r in refs) else 0.0


# ---------------------------------------------------------------------------------------------- token F1
def _f1(pred_tokens: Sequence[str], ref_tokens: Sequence[str]) -> tuple[float, float, float]:
    """(f1, precision, recall) of two token lists; with an empty side, 1 if both are empty else 0 (SQuAD v2)."""
    if not pred_tokens or not ref_tokens:
        same = float(list(pred_tokens) == list(ref_tokens))
        return same, same, same
    common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    precision = common / len(pred_tokens)
    recall = common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def token_f1(solution_str: str, ground_truth: Any, answer_from: str = "action", trajectory: Any = None,
             **kwargs: Any) -> dict[str, float]:
    """SQuAD token F1 of the normalised answer and reference (best reference when several).

    With ``c`` = shared tokens (multiset), ``P = c / len(answer)``, ``R = c / len(reference)``,
    ``F1 = 2PR / (P + R)``. Returns ``{"score": F1, "precision": P, "recall": R}``.

    ``"the cat sat"`` vs ``"a cat sat down"`` -> tokens ``[cat, sat]`` vs ``[cat, sat, down]``: ``c = 2``,
    ``P = 1``, ``R = 2/3``, ``F1 = 0.8``.
    """
    refs = _references("token_f1", ground_truth)
    pred = normalize_answer(_answer_text("token_f1", solution_str, trajectory, answer_from)).split()
    f1, p, r = max(_f1(pred, normalize_answer(ref).split()) for ref in refs)
    return {"score": f1, "precision": p, "recall": r}


# -------------------------------------------------------------------------------------------------- BLEU
@lru_cache(maxsize=16)
def _bleu_metric(tokenize: str, lowercase: bool, smooth_method: str, smooth_value: float | None):
    try:
        from sacrebleu.metrics import BLEU
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ImportError("bleu needs sacrebleu: pip install 'sacrebleu>=2.3'") from exc
    # effective_order: a short sentence is not zeroed for lacking 4-grams (sacrebleu's sentence-level advice).
    return BLEU(tokenize=tokenize, lowercase=lowercase, smooth_method=smooth_method, smooth_value=smooth_value,
                effective_order=True)


def bleu(solution_str: str, ground_truth: Any, answer_from: str = "action", trajectory: Any = None,
         tokenize: str = "13a", lowercase: bool = False, smooth_method: str = "exp",
         smooth_value: float | None = None, **kwargs: Any) -> dict[str, float]:
    """Sentence BLEU of the answer against the reference(s), through sacrebleu, divided by 100: in [0, 1].

    ``sacrebleu.metrics.BLEU(tokenize, lowercase, smooth_method, smooth_value, effective_order=True)
    .sentence_score(answer, references).score / 100``; returns ``{"score": ..., "brevity_penalty": bp}``.
    """
    refs = _references("bleu", ground_truth)
    answer = _answer_text("bleu", solution_str, trajectory, answer_from)
    try:
        metric = _bleu_metric(str(tokenize), bool(lowercase), str(smooth_method), smooth_value)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"bleu: bad option (tokenize={tokenize!r}, smooth_method={smooth_method!r}): {exc}") from exc
    result = metric.sentence_score(answer, refs)
    # sacrebleu's 100.0 for a perfect match can come out as 100.00000000000004: clamp to the documented range.
    return {"score": min(1.0, max(0.0, result.score / 100.0)), "brevity_penalty": float(result.bp)}


# --------------------------------------------------------------------------------------------- math answer
# A number as people and models write it: optional sign and $, thousands commas, decimals, an optional /d.
# The look-behind keeps "17-5" from reading as 17 and -5, and "v1.2.3" from yielding numbers mid-token.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212])?\s?\\?\$?\s?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?))?"
    r"(?![\d])"
)
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_NOISE = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\\%|%|\^\{?\\circ\}?|\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None when there is none."""
    m = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*", text):
        pass
    if m is None:
        return None
    i = m.end()
    if i >= len(text) or text[i] != "{":
        rest = text[i:].split()  # "\boxed 42"
        return rest[0].rstrip("$") if rest else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None  # unbalanced: no usable boxed answer


def _clean_latex(text: str) -> str:
    text = _FRAC.sub(r"(\1)/(\2)", text)
    text = _LATEX_NOISE.sub("", text)
    return text.replace("{", "").replace("}", "").replace("(", "").replace(")", "")


def _match_value(m: re.Match) -> float:
    value = Fraction(m.group("num").replace(",", ""))
    if m.group("den") is not None:
        den = Fraction(m.group("den"))
        if den == 0:
            raise ZeroDivisionError
        value /= den
    return float(-value if m.group("sign") else value)


def parse_number(text: str) -> float | None:
    """The value of a string that is one number and nothing else (after stripping ``$``, LaTeX ``\\frac``,
    spacing commands, ``\\text{units}``, a trailing ``.``), else None.

    ``"$1,234"`` -> 1234.0, ``"-3/4"`` -> -0.75, ``"\\frac{3}{4}"`` -> 0.75, ``"42."`` -> 42.0.
    """
    cleaned = _clean_latex(text).strip().rstrip(".").strip()
    m = _NUMBER.fullmatch(cleaned)
    if m is None:
        return None
    try:
        return _match_value(m)
    except (ZeroDivisionError, ValueError, OverflowError):
        return None


def extract_number(text: str) -> float | None:
    """The answer a reply gives: the content of the last ``\\boxed{...}`` when there is one (its own value,
    else the last number inside it), else the last number in the text; None when there is none.

    ``"17 + 25 = 42"`` -> 42.0; ``"so \\boxed{\\frac{3}{4}} (or 0.8?)"`` -> 0.75; ``"-5 degrees"`` -> -5.0.
    """
    boxed = _last_boxed(text)
    if boxed is not None:
        value = parse_number(boxed)
        if value is not None:
            return value
        text = boxed
    for m in reversed(list(_NUMBER.finditer(_clean_latex(text)))):
        try:
            return _match_value(m)
        except (ZeroDivisionError, ValueError, OverflowError):
            continue
    return None


def _reference_number(ground_truth: Any) -> float:
    """math_answer's reference: a number, or a string that is one (``"####"`` GSM8K answers and ``\\boxed``
    are read too)."""
    if ground_truth is None:
        raise ValueError("math_answer: the task has no ground truth (None); give the task rows a 'ground_truth' "
                         "column (or reward_model.ground_truth) holding the numeric answer")
    if _is_number(ground_truth):
        value = float(ground_truth)
    elif isinstance(ground_truth, str):
        text = ground_truth.split("####")[-1] if "####" in ground_truth else ground_truth
        boxed = _last_boxed(text)
        value = parse_number(boxed if boxed is not None else text)
        if value is None:
            raise ValueError(f"math_answer: ground truth {ground_truth!r} is not a number; math_answer compares "
                             "numeric answers (use exact_match or token_f1 for text answers)")
    else:
        raise TypeError(f"math_answer: ground truth must be a number or a numeric string, got "
                        f"{type(ground_truth).__name__} {ground_truth!r}")
    if not math.isfinite(value):
        raise ValueError(f"math_answer: ground truth {ground_truth!r} is not a finite number")
    return value


def math_answer(solution_str: str, ground_truth: Any, answer_from: str = "action", trajectory: Any = None,
                rel_tol: float = 1e-4, abs_tol: float = 1e-6, format_score: float = 0.0,
                **kwargs: Any) -> dict[str, float]:
    """Numeric answer match.

    The answer is :func:`extract_number` of the reply (last ``\\boxed{}``, else the last number; commas,
    ``$``, fractions ``3/4`` and ``\\frac{3}{4}``, negative numbers); it is correct when
    ``math.isclose(answer, reference, rel_tol=rel_tol, abs_tol=abs_tol)``. Returns
    ``{"score": s, "answer_found": 0|1}`` with ``s = 1`` if correct, ``format_score`` if a number was found but
    is wrong, else 0.
    """
    reference = _reference_number(ground_truth)
    answer = extract_number(_answer_text("math_answer", solution_str, trajectory, answer_from))
    if answer is None:
        return {"score": 0.0, "answer_found": 0.0}
    correct = math.isclose(answer, reference, rel_tol=float(rel_tol), abs_tol=float(abs_tol))
    return {"score": 1.0 if correct else float(format_score), "answer_found": 1.0}
