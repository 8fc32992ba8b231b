"""``openspiel_outcome``: a reward component that scores nothing for training (reward=openspiel gives it weight 0)
and counts how a seat's games ended, so validation and ``openmanus-rl eval`` log it next to the success rate (which
counts wins only, and in tic-tac-toe a draw is the best result against a perfect player).

Per trajectory: ``score`` and ``non_loss`` are 1 when the game ended with the seat's return >= 0 (a win or a draw),
``win``/``draw``/``loss`` one-hot over the game's end (return > 0, == 0, < 0: the seat's own forfeit is a loss, and in
self-play a game another seat forfeited is a draw, as the env returns 0 for it), ``unfinished`` 1
when the episode stopped before the game ended (max_turns, the token budget: neither a win nor a draw), and
``seat<k>/non_loss``, ``seat<k>/win`` for the seat it played. Logged as ``val/reward/<label>/<key>/mean``; the
per-seat keys are averaged over that seat's episodes only (the composer averages an extra over the samples that
carry it).
"""

from __future__ import annotations

from typing import Any

from openmanus_rl_core.protocols import Trajectory

__all__ = ["GameOutcome"]


def _seat(trajectory: Trajectory) -> int | None:
    """The seat the trajectory played: its steps' ``info["seat"]``, else its first observation's header."""
    for turn in trajectory.turns:
        if "seat" in turn.info:
            return int(turn.info["seat"])
    from openmanus_rl_env_openspiel.hooks import HEADER

    found = HEADER.match(trajectory.initial_observation or "")
    return int(found.group(2)) if found else None


class GameOutcome:
    """Win, draw, loss and non-loss of the seat's game (module docstring)."""

    def compute(self, trajectory: Trajectory) -> dict[str, Any]:
        last = trajectory.turns[-1].info if trajectory.turns else {}
        ended = bool(trajectory.turns) and trajectory.turns[-1].done and last.get("score") is not None
        ret = float(last["score"]) if ended else 0.0
        out = {"win": float(ended and ret > 0), "draw": float(ended and ret == 0), "loss": float(ended and ret < 0),
               "unfinished": float(not ended)}
        out["non_loss"] = out["win"] + out["draw"]
        out["score"] = out["non_loss"]
        seat = _seat(trajectory)
        if seat is not None:
            out[f"seat{seat}/non_loss"] = out["non_loss"]
            out[f"seat{seat}/win"] = out["win"]
        return out
