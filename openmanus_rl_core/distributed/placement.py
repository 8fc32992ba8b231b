"""Placing worker ranks on the nodes of a Ray cluster with a placement group.

One bundle per rank: bundle ``i`` holds rank ``i``'s resources (``{"CPU": cpus_per_worker, "GPU": gpus_per_worker}``),
and rank ``i``'s actor is scheduled into bundle ``i`` with a ``PlacementGroupSchedulingStrategy``. The placement
group reserves every bundle atomically (all or nothing), so a group of FSDP ranks either starts whole or fails with a
clear error instead of half of it waiting forever for a node that never comes.

Strategies (Ray's):

=================  =============================================================================================
``PACK``           as few nodes as possible (best effort): ranks share NVLink / shared memory when they fit
``SPREAD``         across as many nodes as possible (best effort): the default, it uses every node of a cluster
``STRICT_PACK``    all bundles on ONE node, or fail
``STRICT_SPREAD``  every bundle on a DIFFERENT node, or fail (needs at least ``num_workers`` nodes)
=================  =============================================================================================

Usage (what the trainer's worker group does)::

    placement = worker_placement(num_workers=W, cpus_per_worker=1, gpus_per_worker=1)
    actors = [ray.remote(Cls).options(**placement.options(rank)).remote(...) for rank in range(W)]
    ...
    placement.remove()      # after the actors are gone; frees the reserved resources

With GPUs the actor and its vLLM rollout engine live in the same process and share the bundle's GPU (colocated):
one bundle per rank is the whole reservation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["STRATEGIES", "WorkerPlacement", "worker_placement", "node_of_each_bundle"]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass
class WorkerPlacement:
    """A ready placement group and one scheduling strategy per rank (``strategies[i]`` targets bundle ``i``)."""

    pg: Any
    bundles: list[dict[str, float]]
    strategies: list[Any]
    strategy: str = "SPREAD"
    _removed: bool = field(default=False, repr=False)

    def __len__(self) -> int:
        return len(self.strategies)

    def options(self, rank: int) -> dict[str, Any]:
        """Keyword arguments for ``ActorClass.options(**...)`` placing ``rank`` on its bundle.

        The actor asks for exactly its bundle's resources (``num_cpus``/``num_gpus``), so it fits the bundle.
        """
        bundle = self.bundles[rank]
        return {
            "num_cpus": float(bundle.get("CPU", 0.0)),
            "num_gpus": float(bundle.get("GPU", 0.0)),
            "scheduling_strategy": self.strategies[rank],
        }

    def nodes(self) -> list[str]:
        """The node id of each bundle, in rank order (see :func:`node_of_each_bundle`)."""
        return node_of_each_bundle(self.pg)

    def remove(self) -> None:
        """Release the reserved resources (idempotent). Actors still running in the group are killed by Ray."""
        if self._removed:
            return
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(self.pg)
        except Exception:  # the cluster is already gone
            pass
        self._removed = True


def _bundle(cpus: float, gpus: float, extra: dict[str, float] | None) -> dict[str, float]:
    bundle: dict[str, float] = {}
    if cpus:
        bundle["CPU"] = float(cpus)
    if gpus:
        bundle["GPU"] = float(gpus)
    for k, v in (extra or {}).items():
        if v:
            bundle[str(k)] = float(v)
    return bundle


def _fmt(resources: dict[str, float]) -> str:
    """``{CPU: 2, GPU: 1, memory: 14.9GiB, ...}`` without Ray's per-node and per-placement-group entries."""
    keys = sorted((k for k in resources if not k.startswith("node:") and "_group_" not in k),
                  key=lambda k: (k not in ("CPU", "GPU"), k))
    parts = []
    for k in keys:
        v = float(resources[k])
        parts.append(f"{k}: {v / 2 ** 30:.1f}GiB" if k in ("memory", "object_store_memory") else f"{k}: {v:g}")
    return "{" + ", ".join(parts) + "}"


def worker_placement(
    num_workers: int,
    cpus_per_worker: float = 1,
    gpus_per_worker: float = 0,
    strategy: str = "SPREAD",
    timeout_s: float = 60.0,
    name: str = "",
    extra_resources: dict[str, float] | None = None,
    check_feasible: bool = True,
) -> WorkerPlacement:
    """Reserve ``num_workers`` bundles of ``{CPU: cpus_per_worker, GPU: gpus_per_worker}`` and wait until ready.

    Needs ``ray.init`` first (local or ``address=...``). ``extra_resources`` adds custom resources to every bundle.
    ``check_feasible``: fail at once when the whole request exceeds ``ray.cluster_resources()`` (turn it off on
    an autoscaling cluster, where the nodes appear while we wait). Raises ``RuntimeError`` naming the request,
    the cluster's total and available resources and what to change when the group is not ready within
    ``timeout_s`` seconds (the half-made group is removed first).
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():
        raise RuntimeError("worker_placement needs a running Ray: call ray.init() (or ray.init(address=...)) first")
    n = int(num_workers)
    if n < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
    strategy = str(strategy).upper()
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown placement strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if cpus_per_worker < 0 or gpus_per_worker < 0:
        raise ValueError(f"cpus_per_worker={cpus_per_worker} and gpus_per_worker={gpus_per_worker} must be >= 0")
    bundle = _bundle(cpus_per_worker, gpus_per_worker, extra_resources)
    if not bundle:
        raise ValueError("a worker bundle needs some resource: set cpus_per_worker > 0 or gpus_per_worker > 0")
    bundles = [dict(bundle) for _ in range(n)]
    requested = {k: v * n for k, v in bundle.items()}

    def describe() -> str:
        nodes = [nd for nd in ray.nodes() if nd.get("Alive")]
        per_node = "; ".join(_fmt(nd.get("Resources", {})) for nd in nodes)
        return (
            f"requested {n} bundle(s) of {_fmt(bundle)} with strategy {strategy} (in all {_fmt(requested)}); "
            f"the cluster has {_fmt(ray.cluster_resources())} in all, {_fmt(ray.available_resources())} available, "
            f"on {len(nodes)} node(s): {per_node}"
        )

    hint = (
        "Lower trainer.num_workers or the CPUs/GPUs per worker (trainer.worker_num_cpus / worker_num_gpus), add "
        "nodes to the cluster (`ray start --address=<head>:<port>` on each), or free resources other jobs hold"
    )
    if strategy == "STRICT_SPREAD" and n > 1:
        hint += f"; STRICT_SPREAD needs at least {n} alive nodes, use SPREAD to allow several ranks per node"
    if strategy == "STRICT_PACK":
        hint += "; STRICT_PACK needs ONE node holding every bundle, use PACK or SPREAD to allow several nodes"

    if check_feasible:
        total = ray.cluster_resources()
        short = {k: v for k, v in requested.items() if total.get(k, 0.0) + 1e-9 < v}
        if short:
            raise RuntimeError(f"cannot place the workers: not enough {', '.join(sorted(short))} in the cluster: "
                               f"{describe()}. {hint}")

    pg = placement_group(bundles, strategy=strategy, name=name or "")
    try:
        ray.get(pg.ready(), timeout=float(timeout_s))
    except Exception as exc:  # GetTimeoutError, or the group failed
        try:
            remove_placement_group(pg)
        except Exception:
            pass
        raise RuntimeError(f"the placement group was not ready within {timeout_s:g}s ({type(exc).__name__}): "
                           f"{describe()}. {hint}") from exc
    strategies = [
        PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i,
                                         placement_group_capture_child_tasks=True)
        for i in range(n)
    ]
    return WorkerPlacement(pg=pg, bundles=bundles, strategies=strategies, strategy=strategy)


def node_of_each_bundle(pg: Any) -> list[str]:
    """The Ray node id (hex) of each bundle of a ready placement group, in bundle order."""
    from ray.util import placement_group_table

    table = placement_group_table(pg)
    where = table.get("bundles_to_node_id") or {}
    n = len(table.get("bundles") or where)
    return [str(where.get(i, where.get(str(i), ""))) for i in range(n)]
