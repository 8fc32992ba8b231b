"""Shared ScienceWorld JVMs: several envs per JVM, each JVM with a bounded heap, each closed with its last env.

The ``scienceworld`` package starts one JVM per env (about 190 MB resident each). Here an env borrows a simulator
object (``PythonInterface``) from a JVM that has room (``envs_per_jvm``, heap ``-Xmx<heap>``), and gives it back on
``close()``; a JVM whose last env closed is shut down at once. Every JVM is started with py4j's ``die_on_exit``: it
exits when this process's end of its stdin pipe closes, so a crashed or killed trainer leaves no java behind.
"""

from __future__ import annotations

import atexit
import subprocess
import threading
from typing import Any

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from scienceworld.constants import BASEPATH, JAR_PATH


class JVM:
    """One java process running the ScienceWorld jar, and the simulator objects it hosts."""

    def __init__(self, heap: str):
        port, proc = launch_gateway(classpath=JAR_PATH, die_on_exit=True, cwd=BASEPATH,
                                    javaopts=[f"-Xmx{heap}"], return_proc=True)
        self.proc: subprocess.Popen = proc
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(auto_field=True, port=port),
                                   java_process=proc)
        self.free: list[Any] = []  # simulator objects no env holds now (reused before new ones are made)
        self.users = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def borrow(self) -> Any:
        self.users += 1
        return self.free.pop() if self.free else self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()

    def give_back(self, server: Any) -> None:
        self.users -= 1
        self.free.append(server)

    def shutdown(self) -> None:
        try:
            self.gateway.shutdown()
        finally:
            if self.proc.poll() is None:
                try:  # die_on_exit: the jar exits when its stdin gets a line or closes
                    self.proc.stdin.write(b"\n")
                    self.proc.stdin.flush()
                    self.proc.stdin.close()
                except OSError:
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)


class JVMPool:
    """JVMs grouped by (heap, envs per JVM); ``acquire`` fills the first JVM with room, or starts one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jvms: dict[tuple[str, int], list[JVM]] = {}

    def acquire(self, envs_per_jvm: int, heap: str) -> tuple[JVM, Any]:
        if int(envs_per_jvm) < 1:
            raise ValueError(f"envs_per_jvm={envs_per_jvm!r} must be >= 1")
        key = (str(heap), int(envs_per_jvm))
        with self._lock:
            group = self._jvms.setdefault(key, [])
            jvm = next((j for j in group if j.users < key[1]), None)
            if jvm is None:
                jvm = JVM(key[0])
                group.append(jvm)
            return jvm, jvm.borrow()

    def release(self, jvm: JVM, server: Any) -> None:
        with self._lock:
            jvm.give_back(server)
            if jvm.users > 0:
                return
            for group in self._jvms.values():
                if jvm in group:
                    group.remove(jvm)
        jvm.shutdown()

    def pids(self) -> list[int]:
        """Process ids of the running JVMs."""
        with self._lock:
            return [j.pid for group in self._jvms.values() for j in group]

    def shutdown_all(self) -> None:
        with self._lock:
            jvms = [j for group in self._jvms.values() for j in group]
            self._jvms.clear()
        for jvm in jvms:
            jvm.shutdown()


POOL = JVMPool()
atexit.register(POOL.shutdown_all)
