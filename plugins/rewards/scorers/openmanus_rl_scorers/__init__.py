"""Function-style scorers for openmanus-rl (entry-point group ``openmanus_rl.rewards``): ``exact_match``,
``token_f1``, ``bleu``, ``math_answer``. Each is a plain ``compute_score(solution_str, ground_truth, **kwargs)``
function; see :mod:`openmanus_rl_scorers.scorers`.
"""

from openmanus_rl_scorers.scorers import (
    bleu,
    exact_match,
    extract_number,
    math_answer,
    normalize_answer,
    parse_number,
    token_f1,
)

__all__ = ["exact_match", "token_f1", "bleu", "math_answer", "normalize_answer", "extract_number", "parse_number"]
