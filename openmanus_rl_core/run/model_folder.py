"""The model folder every worker loads: the user's Hugging Face folder (``model.path``), or the embedded tiny model
and its tokenizer, built once from the env's own text and rebuilt only when what it depends on changes -- never
under a resumed checkpoint, whose weights were trained with that folder's tokenizer."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from openmanus_rl_core.process.alive import Alive
from openmanus_rl_core.config.schema import Config


def prepare_model_dir(cfg: Config, run_dir: Path, train_tasks: Sequence[dict], env_factory: Callable[[], Any],
                      template: Any, log: Callable[[str], None], resuming: bool = False) -> tuple[str, Any]:
    """``(model folder, its tokenizer)``. ``resuming``: a checkpoint is loaded next; an existing folder is kept
    as it is even when the settings it was built from changed (the tokenizer trained on another env text would
    give the checkpoint's token ids other meanings)."""
    from openmanus_rl_core.models.loading import load_model_and_tokenizer, load_tokenizer
    from openmanus_rl_core.run.warmup import build_corpus

    if cfg.model.path:
        model_dir = Path(cfg.model.path).expanduser()
        if not model_dir.exists():
            raise FileNotFoundError(f"model.path={cfg.model.path!r} does not exist; give a local Hugging Face "
                                    "model folder")
    else:
        model_dir = Path(cfg.model.save_dir or run_dir / "model")
        # What the built model depends on; a folder built from something else is rebuilt.
        recipe = json.dumps({"tiny": dataclasses.asdict(cfg.model.tiny), "dtype": cfg.model.dtype,
                             "env": dataclasses.asdict(cfg.env), "template": dataclasses.asdict(cfg.template),
                             "corpus_tasks": cfg.model.corpus_tasks,
                             "train_tasks": [[t["task_id"], t["seed"]] for t in train_tasks]},
                            sort_keys=True, default=str)
        stamp = model_dir / "omrl_recipe.json"
        built = (model_dir / "config.json").exists() and stamp.exists()
        if resuming and built and stamp.read_text() != recipe:
            log(f"resumed: keeping the tiny model's tokenizer in {model_dir}, built from the run's first settings "
                "(the checkpoint was trained with it; changed env, template or corpus settings do not rebuild it)")
        elif not built or stamp.read_text() != recipe:
            t0 = time.perf_counter()
            corpus_tasks = train_tasks[:cfg.model.corpus_tasks or len(train_tasks)]
            corpus = build_corpus(env_factory, template, corpus_tasks, cfg.rollout.max_turns, log=log)
            with Alive(log, "building the tiny model", note=f"its tokenizer from {len(corpus)} corpus texts"):
                load_model_and_tokenizer(cfg.model, corpus, save_dir=model_dir)
            stamp.write_text(recipe)
            log(f"built the tiny model and its tokenizer ({len(corpus)} corpus texts) in "
                f"{time.perf_counter() - t0:.1f}s: {model_dir}")
    return str(model_dir), load_tokenizer(str(model_dir), cfg.model.chat_template)
