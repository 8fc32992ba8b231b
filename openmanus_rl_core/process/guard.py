"""Run one child process and stop it when the process that launched it is gone.

``python -m openmanus_rl_core.process.guard <launcher pid> -- <argv...>`` starts ``argv`` as its child, in the guard's
own process group (the launcher starts the guard as a session leader), and exits with the child's exit code (128 + the
signal's number when a signal ended it, as a shell reports it). Before it exits, it kills with SIGKILL what the child
left running in the group: the launcher would, but it may be the launcher's death that ended the child (an agent that
writes to its stderr, a pipe to the launcher, dies of the broken pipe), and then nobody else will. Every ``--poll``
seconds it checks that its parent is still ``<launcher pid>`` (and that each ``--also`` pid is alive). When the
launcher died without stopping its children (a trainer killed with SIGKILL, an OOM kill), the guard sends SIGTERM to
its whole group, then SIGKILL after ``--grace`` seconds, so no child (an env server, a user's agent) is left holding
its port and memory.

The launcher stops a guarded child as it would any process group: it signals the group, which holds the guard, the
child and anything the child spawned. The guard ignores SIGTERM and SIGINT itself and exits when its child does.
Used by the AgentGym launcher and the OpenEnv server pool (their servers) and :mod:`openmanus_rl_core.gateway.agents`
(the user's agents).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


# Set by a training run's driver before it starts its local Ray: the workers it spawns inherit it, so what they
# launch is guarded against the driver's death too (Ray's workers outlive a driver killed with SIGKILL by a minute).
DRIVER_ENV = "OMRL_DRIVER_PID"
_LEFTOVER_WAIT_S = 5.0  # how long the guard, once its child has exited, waits for the SIGKILLed leftovers to go


def guarded(argv: list[str], *, poll: float = 0.5, grace: float = 5.0) -> list[str]:
    """``argv`` run under a guard that watches this process (and the training run's driver, when this process is one
    of its workers on its machine): start the result with ``start_new_session=True``."""
    driver = os.environ.get(DRIVER_ENV)
    also = ["--also", driver] if driver and driver != str(os.getpid()) else []
    return [sys.executable, "-m", "openmanus_rl_core.process.guard", "--poll", f"{poll:g}", "--grace", f"{grace:g}", *also,
            str(os.getpid()), "--", *argv]  # the options first: what follows the pid is the child's


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie not yet reaped included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, read from /proc. A SIGKILL is delivered
    asynchronously: the group's processes are still listed here for a moment after ``killpg`` returns."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                state, _ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # it exited while we looked
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def _end_leftovers() -> None:
    """SIGKILL every other live process of the guard's group, until none is left (a SIGKILL lands asynchronously, and
    a process may fork once more before it does). Nothing when the guard does not lead its group: that group is
    its launcher's."""
    me = os.getpid()
    if os.getpgrp() != me:
        return
    deadline = time.monotonic() + _LEFTOVER_WAIT_S
    while (left := [pid for pid in group_members(me) if pid != me]) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # gone already
                pass
        time.sleep(0.01)


def _stop_group(grace: float, child: subprocess.Popen) -> None:
    os.killpg(0, signal.SIGTERM)  # the guard's own handler ignores it; the child and its children get it
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(0, signal.SIGKILL)  # whatever is left of the group, the guard included


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openmanus_rl_core.process.guard")
    parser.add_argument("parent", type=int, help="pid of the launching process")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between checks of the parent")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--also", type=int, action="append", default=[],
                        help="another pid whose exit stops the child too (a training run's driver)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the child's argv")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")

    def on_signal(signum: int, frame: object) -> None:  # the launcher's stop: the child got the signal too
        pass  # a handler, not SIG_IGN, which the child would inherit through exec

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"guard: cannot start {command!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    while True:
        try:  # waits on the child rather than sleeping: its exit is seen at once
            rc = child.wait(timeout=args.poll)
            _end_leftovers()
            return rc if rc >= 0 else 128 - rc
        except subprocess.TimeoutExpired:
            pass
        gone = args.parent if os.getppid() != args.parent else next((p for p in args.also if _gone(p)), None)
        if gone is not None:  # also when the launcher died halfway through its own stop
            try:
                print(f"guard: pid {gone} is gone; stopping {command[0]!r}", file=sys.stderr, flush=True)
            except OSError:  # stderr was a pipe to the launcher, closed with it
                pass
            _stop_group(args.grace, child)


if __name__ == "__main__":
    sys.exit(main())
