"""A training batch with very uneven row lengths, and one policy update on it by a group of ranks.

    python tests/uneven_update.py MODEL_DIR OUT_DIR RANKS SHARDING[,SHARDING...] [--group N] [--turns] [--chunks S,S..]
        [override ...]

runs ``RANKS`` processes (``--group N``: the batch's rows share prompts in groups of N); for each ``actor.sharding`` choice in turn they form a gloo group, build an
:class:`ActorWorker` with the overrides, and make one update on their share of :func:`uneven_batch`; rank 0 saves
the parameter change and the metrics to ``OUT_DIR/<choice>.pt``. One launch for every choice: the processes and
their imports are paid once. Every rank then syncs its rollout engine and saves the largest gap between the
engine's weights and the trained ones to ``OUT_DIR/<choice>-engine-gap-<rank>.pt``. ``--chunks 0,4,12``: instead of one update, the rows from each start to the next
(whole groups) are one chunk, split among the ranks as the trainer does, each accumulated
(``ActorWorker.accumulate``), then one ``step_accumulated``: the overlapped update.
"""

from __future__ import annotations

import sys

import torch

from openmanus_rl_core.batch import Batch


def uneven_batch(vocab: int, rows: int = 16, seed: int = 0, pad: int = 0, group: int = 1) -> Batch:
    """``rows`` rows whose prompts (2-48 tokens) and responses (1-80 positions) differ by an order of magnitude;
    each response has an observation span (attended, mask 0). Advantages are random; no old log-probs (an
    on-policy update). ``group``: consecutive rows in groups of this size share their first row's prompt (a GRPO
    group's samples), each with its own response."""
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(2, 49, (rows,), generator=g)
    rlen = torch.randint(1, 81, (rows,), generator=g)
    plen[0], rlen[1] = 48, 80  # the layout's P and R are the longest prompt and response
    plen = plen[torch.arange(rows) // group * group]
    P, R = int(plen.max()), int(rlen.max())
    ids = torch.full((rows, P + R), pad, dtype=torch.long)
    attn = torch.zeros((rows, P + R), dtype=torch.long)
    mask = torch.zeros((rows, R))
    for i, (p, r) in enumerate(zip(plen.tolist(), rlen.tolist())):
        ids[i, P - p:P + r] = torch.randint(1, vocab, (p + r,), generator=g)
        if i % group:
            ids[i, :P] = ids[i - i % group, :P]
        attn[i, P - p:P + r] = 1
        mask[i, :r] = 1
        if r > 6:  # an observation inside the response: attended, not trained
            mask[i, r // 3:r // 3 + 3] = 0
    batch = Batch(tensors={"input_ids": ids, "attention_mask": attn,
                           "position_ids": (attn.cumsum(-1) - 1).clamp_min(0), "responses": ids[:, P:].clone(),
                           "response_mask": mask})
    batch["advantages"] = torch.randn((rows, R), generator=g) * mask
    return batch


def start_alike(batch: Batch, vocab: int, seed: int = 4) -> Batch:
    """``batch`` (groups of 1) turned into per-turn samples: every prompt starts with one 12-token system prompt,
    then, for the rows of each group of 4, a task of 6-12 tokens of their own (cut to leave each row at least one
    token of its own); the row with the shortest prompt shares nothing. In place; returns ``batch``."""
    g = torch.Generator().manual_seed(seed)
    ids, attn = batch["input_ids"], batch["attention_mask"]
    P = ids.shape[1] - batch["responses"].shape[1]
    length = attn[:, :P].sum(-1)
    system = torch.randint(1, vocab, (12,), generator=g)
    for i in range(len(batch)):
        task = torch.randint(1, vocab, (12,), generator=g) if i % 4 == 0 else task
        head = torch.cat([system, task[:6 + i // 4 % 4 * 2]])
        n = min(len(head), int(length[i]) - 1) if i != int(length.argmin()) else 0
        ids[i, P - int(length[i]):P - int(length[i]) + n] = head[:n]
    batch["responses"] = ids[:, P:].clone()
    return batch


def save_small_model(folder) -> str:
    """A tiny Qwen2 (32 wide) and its tokenizer saved in ``folder``; returns the folder."""
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.config.schema import ModelConfig, TinyModelConfig

    corpus = ["Say: apple", "<action>apple</action>", "Say: bird", "<action>bird</action>"] * 3
    tiny = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                           intermediate_size=64, initializer_range=0.1)
    load_model_and_tokenizer(ModelConfig(tiny=tiny), corpus, save_dir=folder)
    return str(folder)


def one_rank_worker(model_dir: str, group: tuple, *overrides: str):
    """An in-process :class:`ActorWorker` of one rank on ``group`` (address, port), with the SGD-like overrides."""
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.workers import ActorWorker

    w = ActorWorker(load(sgd_like_overrides() + list(overrides), training=False), rank=0, world_size=1,
                    model_dir=model_dir, total_steps=10)
    w.setup(*group)
    return w


def sgd_like_overrides() -> list[str]:
    """AdamW's first step with ``lr = eps`` far above every gradient entry: the parameters move by the gradient."""
    return ["seed=3", "env=word_copy", "template=react", "rollout.max_new_tokens=8", "trainer.device=cpu",
            "actor.lr=1e4", "actor.eps=1e4", "actor.grad_clip=0"]


def flat_params(worker) -> torch.Tensor:
    """Every parameter of the training model, full (gathered on every rank), flattened."""
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten().clone()
                      for p in worker.model.parameters()])


def _rank(rank: int, world: int, model_dir: str, out: str, ports: list[int], choices: list[str],
          overrides: list[str], group: int, turns: bool, chunks: list[int]) -> None:
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.distributed.sharding import shard_batch
    from openmanus_rl_core.workers import ActorWorker

    for choice, port in zip(choices, ports):
        cfg = load(sgd_like_overrides() + [f"actor.sharding={choice}"] + overrides, training=False)
        w = ActorWorker(cfg, rank=rank, world_size=world, model_dir=model_dir, total_steps=10)
        info = w.setup("127.0.0.1", port)
        batch = uneven_batch(len(w.tokenizer), pad=w.tokenizer.pad_token_id, group=group)
        if turns:
            start_alike(batch, len(w.tokenizer))
        shards, _ = shard_batch(batch, world)
        before = flat_params(w)
        if chunks:
            for lo, hi in zip(chunks, [*chunks[1:], len(batch)]):
                w.accumulate(shard_batch(batch[list(range(lo, hi))], world)[0][rank])
            metrics = w.step_accumulated(float(batch["response_mask"].sum()))
        else:
            metrics = w.update(shards[rank], step=1)
        delta = flat_params(w) - before
        w.sync_rollout_weights()  # every rank's engine must then hold the trained weights
        engine = torch.cat([p.detach().flatten() for p in w.engine.model.parameters()])
        torch.save(float((engine - flat_params(w)).abs().max()), f"{out}/{choice}-engine-gap-{rank}.pt")
        if rank == 0:
            torch.save({"delta": delta, "metrics": metrics, "sharding": info["sharding"]}, f"{out}/{choice}.pt")
        w.shutdown()


def main(argv: list[str], timeout_s: float = 300.0) -> None:
    """The launch above (``argv`` as on the command line): the ranks are processes of their own, started by this
    one (the tests call it in pytest's process); a rank that fails raises here, with its traceback, and ranks still
    running after ``timeout_s`` are killed and raise TimeoutError."""
    import socket
    import time

    import torch.multiprocessing as mp

    from openmanus_rl_core.distributed.ray_node import local_store_path

    model_dir, out, world, choices, *overrides = argv
    choices = choices.split(",")
    group, turns, chunks = 1, False, []
    if overrides[:1] == ["--group"]:
        group, overrides = int(overrides[1]), overrides[2:]
    if overrides[:1] == ["--turns"]:  # per-turn samples whose prompts start alike (start_alike)
        turns, overrides = True, overrides[1:]
    if overrides[:1] == ["--chunks"]:  # the overlapped update, chunks starting at these rows
        chunks, overrides = [int(x) for x in overrides[1].split(",")], overrides[2:]
    sockets = [socket.socket() for _ in choices]
    for s in sockets:  # held together, so the ports differ
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    for port in ports:  # a killed run's rendezvous file for the same port would hang the group
        local_store_path(port).unlink(missing_ok=True)
    ranks = mp.spawn(_rank, args=(int(world), model_dir, out, ports, choices, overrides, group, turns, chunks),
                     nprocs=int(world), join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ranks.join(timeout=1.0):  # raises as soon as a rank fails
            if time.monotonic() > deadline:
                raise TimeoutError(f"uneven_update: the ranks did not end within {timeout_s:.0f}s")
    finally:
        for p in ranks.processes:
            if p.is_alive():
                p.kill()
                p.join(10)


if __name__ == "__main__":
    main(sys.argv[1:])
