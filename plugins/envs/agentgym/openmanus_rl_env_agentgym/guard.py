"""Run one env server and stop it when the process that launched it is gone.

``python -m openmanus_rl_env_agentgym.guard <launcher pid> -- <argv...>`` starts ``argv`` as its child, in the
guard's own process group (the launcher starts the guard as a session leader), and exits with the child's exit
code. Every ``poll`` seconds it checks that its parent is still ``<launcher pid>``. When the launcher died without
stopping its servers (a trainer killed with SIGKILL, an OOM kill), the guard sends SIGTERM to its whole group,
then SIGKILL after ``--grace`` seconds, so no server is left holding its port and memory.

The launcher's own ``stop()`` is unchanged by the guard: it signals the process group, which holds the guard,
the server and anything the server spawned.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def _stop_group(grace: float, child: subprocess.Popen) -> None:
    os.killpg(0, signal.SIGTERM)  # the guard's own handler ignores it; the server and its children get it
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(0, signal.SIGKILL)  # whatever is left of the group, the guard included


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openmanus_rl_env_agentgym.guard")
    parser.add_argument("parent", type=int, help="pid of the launching process")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between checks of the parent")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server's argv")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no server command after --")

    stopping = False

    def on_signal(signum: int, frame: object) -> None:  # the launcher's stop(): the child got the signal too
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"guard: cannot start {command!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    while True:
        rc = child.poll()
        if rc is not None:
            return rc
        if os.getppid() != args.parent and not stopping:
            print(f"guard: launcher pid {args.parent} is gone; stopping the server", file=sys.stderr, flush=True)
            _stop_group(args.grace, child)
        time.sleep(args.poll)


if __name__ == "__main__":
    sys.exit(main())
