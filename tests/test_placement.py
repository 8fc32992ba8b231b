"""Worker placement on a real two-node Ray cluster started on this machine with the ``ray`` CLI.

The cluster is a head (``ray start --head``, 1 CPU, custom resource ``node_a``) and a second node (``ray start
--address=<head>``, 1 CPU, ``node_b``), each in its own temporary directory's session, with token authentication off
(it is a throw-away cluster on this machine's own address). Both are started with ``--block`` in their own process
groups, so the test stops exactly the processes it started (their process groups, then any actor process left),
never other Ray instances on the machine (``ray stop`` would kill every Ray process here).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ray = pytest.importorskip("ray")

from openmanus_rl_core.distributed.placement import node_of_each_bundle, worker_placement  # noqa: E402

BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket stays bound until all are chosen, so none is handed out twice."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TwoNodeCluster:
    """A head and one more node on this machine; ``address`` is ``127.0.0.1:<gcs port>``."""

    def __init__(self, cpus_per_node: int = 1, timeout: float = 60.0, attempts: int = 3):
        self.env = dict(os.environ)
        self.env.pop("RAY_ADDRESS", None)
        self.env["RAY_AUTH_MODE"] = "disabled"
        self.env["RAY_USAGE_STATS_ENABLED"] = "0"
        self.extra_pids: set[int] = set()  # actor processes the tests saw (Ray gives them their own sessions)
        # A port chosen free can be taken by another process before Ray binds it: start again on fresh ports.
        for attempt in range(attempts):
            self.procs: list[subprocess.Popen] = []
            # Short path: Ray's unix socket paths must stay under ~107 characters.
            self.tmp = tempfile.mkdtemp(prefix="omrl-ray-", dir="/tmp")
            # GCS, client server, and four agent/metrics ports for each of the two nodes, all distinct.
            self.port, self._client_port, *self._node_ports = _free_ports(10)
            self.address = f"127.0.0.1:{self.port}"
            try:
                self._start(cpus_per_node, timeout)
                return
            except BaseException as e:
                self.stop()
                if not isinstance(e, RuntimeError) or attempt == attempts - 1:
                    raise

    def _node_args(self, cpus: int, node: int) -> list[str]:
        # Every node on one machine needs its own agent and metrics ports (the defaults would collide).
        listen, grpc, metrics, runtime_env = self._node_ports[4 * node:4 * node + 4]
        return ["--block", "--disable-usage-stats", f"--temp-dir={self.tmp}", f"--num-cpus={cpus}", "--num-gpus=0",
                f"--dashboard-agent-listen-port={listen}", f"--dashboard-agent-grpc-port={grpc}",
                f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}"]

    def _popen(self, args: list[str], log: str) -> subprocess.Popen:
        out = open(os.path.join(self.tmp, log), "w")
        p = subprocess.Popen([RAY, "start", *args], stdout=out, stderr=subprocess.STDOUT, env=self.env,
                             start_new_session=True)  # its own process group: stop() kills exactly this tree
        self.procs.append(p)
        return p

    def _start(self, cpus: int, timeout: float) -> None:
        t0 = time.monotonic()
        head = self._popen(["--head", f"--port={self.port}", "--include-dashboard=false",
                            f"--ray-client-server-port={self._client_port}", '--resources={"node_a": 1}',
                            *self._node_args(cpus, 0)], "head.log")
        # The second node retries its connection until the head's GCS answers, so both start together.
        self._popen([f"--address={self.address}", '--resources={"node_b": 1}', *self._node_args(cpus, 1)],
                    "node.log")
        while "Ray runtime started" not in Path(self.tmp, "head.log").read_text():
            if head.poll() is not None or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the Ray head did not start: {self.log_tail()}")
            time.sleep(0.2)

    def wait_for_nodes(self, n: int = 2, timeout: float = 60.0) -> None:
        t0 = time.monotonic()
        while len([nd for nd in ray.nodes() if nd.get("Alive")]) < n:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"only {len(ray.nodes())} Ray node(s) joined: {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self) -> str:
        parts = []
        for name in ("head.log", "node.log"):
            f = Path(self.tmp, name)
            if f.exists():
                parts.append(f"{name}: " + " | ".join(f.read_text().strip().splitlines()[-5:]))
        return "; ".join(parts)

    def stop(self) -> None:
        """SIGTERM to both nodes' process groups, SIGKILL after a few seconds; then any actor process still up."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:  # the group, also when its leader already exited (gcs_server, raylet, agents)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10  # actor workers exit when their raylet is gone
        while any(_alive(pid) for pid in self.extra_pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.extra_pids:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def leftover_pids(self) -> list[int]:
        pids = {p.pid for p in self.procs} | self.extra_pids
        groups = {p.pid for p in self.procs}
        out = [pid for pid in pids if _alive(pid) and not _is_zombie(pid)]
        for entry in Path("/proc").iterdir():  # anything still in the nodes' process groups
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) in groups and not _is_zombie(int(entry.name)):
                        out.append(int(entry.name))
                except (ProcessLookupError, PermissionError):
                    pass
        return sorted(set(out))


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _reread_ray_auth() -> None:
    """This process's Ray reads RAY_AUTH_MODE again (its config and its token cache, as Ray does when it turns token
    mode on): a local Ray that ran earlier in this process (another module's in-process runs) leaves token mode in
    both, and this driver's actors would then never start on the cluster, which has none."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():  # another test left a local Ray up in this process: we need a fresh driver
        ray.shutdown()
    c = TwoNodeCluster()
    old_auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # the driver must speak the cluster's (unauthenticated) protocol
    _reread_ray_auth()
    try:
        ray.init(address=c.address, logging_level="warning", log_to_driver=False)
        c.wait_for_nodes(2)
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()
        if old_auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = old_auth
        _reread_ray_auth()
        left = c.leftover_pids()
        assert not left, f"processes of the test cluster still running: {left}"


@ray.remote
class _Where:
    def where(self) -> tuple[str, int, float]:
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), os.getpid(), float(ray.available_resources().get("CPU", 0.0))


def test_spread_places_ranks_on_both_nodes(cluster):
    placement = worker_placement(2, cpus_per_worker=1, strategy="SPREAD", timeout_s=30)
    try:
        nodes = node_of_each_bundle(placement.pg)
        assert len(nodes) == 2 and len(set(nodes)) == 2 and all(nodes)
        assert placement.nodes() == nodes
        actors = [_Where.options(**placement.options(rank)).remote() for rank in range(2)]
        where = ray.get([a.where.remote() for a in actors], timeout=60)
        cluster.extra_pids.update(pid for _, pid, _ in where)
        # Rank i runs on bundle i's node, and the two ranks are on two different nodes.
        assert [node for node, _, _ in where] == nodes
        alive = {nd["NodeID"] for nd in ray.nodes() if nd.get("Alive")}
        assert set(nodes) == alive
        for a in actors:
            ray.kill(a)
    finally:
        placement.remove()


def test_errors_name_the_request_and_the_cluster(cluster):
    # Infeasible at once: more CPUs than the whole cluster has.
    with pytest.raises(RuntimeError, match=r"not enough CPU.*requested 3 bundle\(s\) of \{CPU: 1\}.*the cluster has"):
        worker_placement(3, cpus_per_worker=1, timeout_s=5)
    # Feasible in total (1.5 of 2 CPUs) but not with one bundle per node on two nodes: times out, names both sides.
    with pytest.raises(RuntimeError, match=r"not ready within 3s.*STRICT_SPREAD.*on 2 node\(s\).*at least 3"):
        worker_placement(3, cpus_per_worker=0.5, strategy="STRICT_SPREAD", timeout_s=3)
    # The half-made group was removed: the whole cluster is free again.
    t0 = time.monotonic()
    while ray.available_resources().get("CPU", 0.0) < 2.0 and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) == 2.0
    with pytest.raises(ValueError, match="unknown placement strategy"):
        worker_placement(2, strategy="EVERYWHERE")
    with pytest.raises(ValueError, match="num_workers"):
        worker_placement(0)


@pytest.mark.slow
def test_trainer_runs_two_steps_with_workers_on_both_nodes(cluster, tmp_path):
    """``openmanus-rl train trainer.ray_address=<head>``: the tiny default, 2 GRPO steps, one actor rank per node.

    Each node has 1 CPU and each of the 2 actor ranks takes 1 CPU, so the ranks cannot share a node; the GCS's
    actor table then shows on which node each rank ran.
    """
    env = dict(cluster.env)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    cmd = [
        str(BIN / "openmanus-rl"), "train",
        f"trainer.ray_address={cluster.address}",
        "trainer.total_steps=2", "trainer.num_workers=2", "trainer.worker_num_cpus=1",
        "trainer.val_before_train=false", "trainer.val_at_end=false", "warmup.enabled=false",
        "trainer.save_at_end=false", "trainer.loggers=[]", "trainer.progress=false",
        "data.train_batch_size=2", "rollout.max_new_tokens=16",
        f"trainer.output_dir={tmp_path / 'outputs'}", f"data.dir={tmp_path / 'data'}",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    metrics = list(Path(tmp_path / "outputs").rglob("metrics.jsonl"))
    assert metrics, f"no metrics.jsonl under {tmp_path / 'outputs'}: {out[-2000:]}"
    steps = [line for line in metrics[0].read_text().splitlines() if line.strip()]
    assert len(steps) >= 2
    # Where the actor ranks ran: the GCS keeps finished actors in its table.
    try:
        from ray._private.state import actors as actor_table
    except ImportError:  # pragma: no cover - private API moved
        pytest.skip("this Ray has no ray._private.state.actors; the 1-CPU nodes still force one rank per node")
    rows = [a for a in actor_table().values() if "ActorWorker" in str(a.get("ActorClassName", ""))]
    nodes = {str((a.get("Address") or {}).get("NodeID", "")) for a in rows}
    alive = {nd["NodeID"] for nd in ray.nodes() if nd.get("Alive")}
    assert len(rows) == 2 and nodes == alive, rows
    print(f"trained 2 steps on 2 nodes in {time.monotonic() - t0:.0f}s")
