"""``reward_model``: a Hugging Face sequence-classification model scores each trajectory's text.

The model is any ``AutoModelForSequenceClassification`` with one output (``num_labels=1``) in a local folder (no
hub downloads); its tokenizer is read from the same folder. For a trajectory the scored text is::

    text = template.replace("{prompt}", prompt).replace("{response}", response)

where ``prompt`` is ``trajectory.initial_observation`` and ``response`` is

- ``text="final"`` (default): the last reply, ``trajectory.final_response``;
- ``text="conversation"``: every reply followed by the env's observation to it (the last observation left out),
  joined by newlines: ``reply_0 \\n obs_0 \\n reply_1 ... reply_k``.

The value is the model's logit for that text (``sigmoid(logit)`` with ``sigmoid=True``), a float per trajectory.
Texts longer than ``max_length`` tokens keep their end (``truncation_side="left"``: the response matters most).

Batched: :meth:`RewardModelScorer.compute_batch` scores many trajectories with one forward pass per
``batch_size`` texts (sorted by length to pad little; right padding, so the scores do not depend on the batch).
The composer calls it once per training batch. The model loads lazily, on first use, on ``device``: ``auto`` is
CUDA when available (the trainer's device), else the CPU.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any, Sequence

from openmanus_rl_core.protocols import Trajectory

__all__ = ["RewardModelScorer"]

TEXTS = ("final", "conversation")


class RewardModelScorer:
    """A reward component backed by a sequence-classification model (see the module docstring).

    ``RewardModelScorer(model_path, batch_size=8, device="auto", max_length=512, template="{prompt}{response}",
    text="final", sigmoid=False, dtype=None, truncation_side="left")``.
    """

    def __init__(self, model_path: str, batch_size: int = 8, device: str = "auto", max_length: int = 512,
                 template: str = "{prompt}{response}", text: str = "final", sigmoid: bool = False,
                 dtype: str | None = None, truncation_side: str = "left"):
        if not model_path or not isinstance(model_path, (str, Path)):
            raise ValueError(f"reward_model: model_path must be a local folder, got {model_path!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"reward_model: batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"reward_model: max_length must be an int >= 2, got {max_length!r}")
        if not isinstance(template, str) or "{response}" not in template:
            raise ValueError(f"reward_model: template must be a string containing {{response}}, got {template!r}")
        if text not in TEXTS:
            raise ValueError(f"reward_model: text={text!r}; valid values are {list(TEXTS)}")
        if truncation_side not in ("left", "right"):
            raise ValueError(f"reward_model: truncation_side={truncation_side!r}; valid values are 'left', 'right'")
        if not (Path(model_path).expanduser() / "config.json").is_file():
            # Checked now (cheap) so a wrong path stops the run at start-up, not as an error on every sample.
            raise FileNotFoundError(
                f"reward_model: {model_path} is not a model folder (no config.json); set model_path to a local "
                "folder saved with save_pretrained (models are never downloaded at run time)")
        self.model_path = str(model_path)
        self.batch_size = batch_size
        self.device_spec = str(device)
        self.max_length = max_length
        self.template = template
        self.text = text
        self.sigmoid = bool(sigmoid)
        self.dtype = dtype
        self.truncation_side = truncation_side
        self.model = None
        self.tokenizer = None
        self.device = None
        self._lock = threading.Lock()

    # ----------------------------------------------------------------------------------------- loading
    def _resolve_device(self):
        import torch

        spec = self.device_spec
        if spec == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            dev = torch.device(spec)
        except RuntimeError as exc:
            raise ValueError(f"reward_model: device={spec!r} is not a torch device (auto, cpu, cuda, cuda:0 ...)") from exc
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"reward_model: device={spec!r} but CUDA is not available here; use device=auto or cpu")
        return dev

    def load(self) -> "RewardModelScorer":
        """Load the tokenizer and the model (done on first use); returns self."""
        with self._lock:
            if self.model is not None:
                return self
            import torch
            from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

            path = Path(self.model_path).expanduser()
            if not (path / "config.json").is_file():
                raise FileNotFoundError(
                    f"reward_model: {path} is not a model folder (no config.json); set model_path to a local "
                    "folder saved with save_pretrained (models are never downloaded at run time)")
            device = self._resolve_device()
            tok = AutoTokenizer.from_pretrained(str(path))
            if tok.pad_token_id is None:
                if tok.eos_token is None:
                    raise ValueError(f"reward_model: the tokenizer in {path} has neither a pad nor an eos token; "
                                     "batched scoring needs one")
                tok.pad_token = tok.eos_token
            # Right padding: every text keeps positions 0..L-1 and the model pools its last real token, so a
            # text's score is the same alone or in a batch.
            tok.padding_side = "right"
            tok.truncation_side = self.truncation_side
            kwargs: dict[str, Any] = {"num_labels": 1}
            if self.dtype not in (None, "auto"):
                dt = getattr(torch, str(self.dtype), None)
                if not isinstance(dt, torch.dtype):
                    raise ValueError(f"reward_model: dtype={self.dtype!r} is not a torch dtype (float32, bfloat16 ...)")
                kwargs["dtype"] = dt
            config = AutoConfig.from_pretrained(str(path))
            is_classifier = any(str(a).endswith("ForSequenceClassification") for a in (config.architectures or []))
            if is_classifier and int(config.num_labels) != 1:
                raise ValueError(f"reward_model: {path} is a classifier with num_labels={config.num_labels}; a reward "
                                 "model gives one score per text (num_labels=1)")
            model = AutoModelForSequenceClassification.from_pretrained(str(path), **kwargs)
            if getattr(model.config, "pad_token_id", None) is None:
                model.config.pad_token_id = tok.pad_token_id  # pooling finds the last non-pad token with it
            model.to(device).eval()
            self.tokenizer, self.device, self.model = tok, device, model
        return self

    def __getstate__(self) -> dict:
        # Shipped to another process (Ray): the model reloads there, on that process's device.
        state = dict(self.__dict__)
        state.update(model=None, tokenizer=None, device=None, _lock=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ scoring
    def text_of(self, trajectory: Trajectory) -> str:
        """The text the model scores for ``trajectory`` (see the module docstring)."""
        prompt = trajectory.initial_observation or ""
        if self.text == "final":
            response = trajectory.final_response
        else:
            parts: list[str] = []
            turns = trajectory.turns
            for i, t in enumerate(turns):
                parts.append(t.response)
                if i < len(turns) - 1 and t.observation:
                    parts.append(t.observation)
            response = "\n".join(parts)
        return self.template.replace("{prompt}", prompt).replace("{response}", response)

    def score_texts(self, texts: Sequence[str]) -> list[float]:
        """One float per text, in order; ``batch_size`` texts per forward pass."""
        import torch

        self.load()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths together: less padding
        scores: list[float] = [0.0] * len(texts)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt")
                enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
                logits = self.model(**enc).logits.float()[:, 0]
                if self.sigmoid:
                    logits = torch.sigmoid(logits)
                for i, v in zip(idx, logits.cpu().tolist()):
                    scores[i] = float(v)
        return scores

    def compute_batch(self, trajectories: Sequence[Trajectory]) -> list[float]:
        """Scores of many trajectories, batched (the composer calls this once per training batch)."""
        return self.score_texts([self.text_of(t) for t in trajectories])

    def compute(self, trajectory: Trajectory) -> float:
        value = self.score_texts([self.text_of(trajectory)])[0]
        if not math.isfinite(value):
            raise ValueError(f"reward_model: the model returned {value!r} for task {trajectory.task_id}")
        return value

    def __repr__(self) -> str:
        return (f"RewardModelScorer({self.model_path!r}, batch_size={self.batch_size}, device={self.device_spec!r}, "
                f"max_length={self.max_length}, text={self.text!r})")
