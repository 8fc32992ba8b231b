"""The Ray instance a run uses: a private single-node one that listens on loopback only, or a cluster joined by
address.

A local Ray started with its defaults listens on every interface: the GCS, the raylet, each worker's gRPC server
and the dashboard agent would accept connections from the whole network, and Ray's RPCs run code. Ray binds its
servers to 127.0.0.1 only when the node's address is loopback, and it turns a loopback ``_node_ip_address`` into
the machine's routable address unless its "local only" switch (the environment variable below, read when
``ray._private.ray_constants`` is imported) is off. So a local start sets that switch before Ray reads it, starts
without a dashboard, and checks the address the node got. A cluster joined with ``trainer.ray_address`` is used
as its operator configured it.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["start_ray", "is_loopback", "LOCAL_ONLY_ENV", "local_store_path", "loopback_interface"]

# Ray reads this at import: "0" makes a local node's address 127.0.0.1 (loopback) instead of the routable one.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(ip: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def local_store_path(port: int) -> Path:
    """The rendezvous file of a single-node process group (torch's TCP store would listen on every interface)."""
    return Path(tempfile.gettempdir()) / f"openmanus-rl-store-{os.getuid()}-{int(port)}"


def loopback_interface() -> str | None:
    """The name of the network interface that holds 127.0.0.1 (``lo`` on Linux), for gloo's and NCCL's sockets."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addrs):
            return name
    return None


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through the callers' finally blocks: ray.shutdown() runs


def start_ray(address: str | None, num_cpus: int, **init_kwargs: Any) -> None:
    """``ray.init``: join ``address`` when given, else start a local node bound to 127.0.0.1 with ``num_cpus``.

    Raises RuntimeError (after stopping it again) if the local node came up on a non-loopback address. Afterwards
    SIGTERM raises SystemExit in the driver (replacing the handler Ray's core installs, which aborts the process),
    so a terminated run shuts Ray down like one that ends or fails. A caller that had its own SIGTERM handler (a
    training run's stop) gets it back, and gets a SIGTERM that came while Ray started (Ray's init exits on it).
    """
    from openmanus_rl_core.process.guard import DRIVER_ENV

    if not address:  # the local node's workers inherit it: what they launch dies with this driver (process/guard.py)
        os.environ[DRIVER_ENV] = str(os.getpid())
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    own = callable(before)
    try:
        _start(address, num_cpus, init_kwargs, keep_handler=own)
    except SystemExit as exc:
        if own and exc.code == signal.SIGTERM:  # Ray's init handler: the signal goes to the caller's handler
            import ray

            ray.shutdown()
            signal.signal(signal.SIGTERM, before)
            before(signal.SIGTERM, None)  # it may raise at once, or only note the stop
            raise KeyboardInterrupt("SIGTERM while Ray started") from None
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, before if own else _exit_on_sigterm)


@contextmanager
def _sigterm_kept(keep: bool):
    """While ``ray.init`` runs: with ``keep``, the caller's SIGTERM handler stays (Ray's own, ``sys.exit``, would
    take a signal meant for a training run's stop). Ray is imported by then."""
    from ray._private import utils as ray_utils

    install = ray_utils.set_sigterm_handler
    if keep:
        ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = install


def _start(address: str | None, num_cpus: int, init_kwargs: dict, keep_handler: bool = False) -> None:
    if address:
        import ray

        with _sigterm_kept(keep_handler):
            ray.init(address=str(address), include_dashboard=False, **init_kwargs)
        return
    # Set for ray.init only (the node's processes inherit it): left set, it would stop this process's children
    # from forming a multi-node cluster (`ray start` refuses to join one).
    before_env = os.environ.get(LOCAL_ONLY_ENV)
    os.environ[LOCAL_ONLY_ENV] = "0"  # before Ray's constants are read
    import ray
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # Ray was imported before this call (a plugin, a test): same switch
    try:
        with _sigterm_kept(keep_handler):
            ray.init(num_cpus=int(num_cpus), include_dashboard=False, **init_kwargs)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before
        if before_env is None:
            os.environ.pop(LOCAL_ONLY_ENV, None)
        else:
            os.environ[LOCAL_ONLY_ENV] = before_env
    node_ip = ray.util.get_node_ip_address()
    if not is_loopback(node_ip):
        ray.shutdown()
        raise RuntimeError(f"the local Ray node came up on {node_ip}, not on 127.0.0.1, so it would listen on the "
                           f"network; this Ray version ignores {LOCAL_ONLY_ENV}=0. Start Ray yourself "
                           f"(`ray start --head --node-ip-address=127.0.0.1`) and pass trainer.ray_address=auto")
