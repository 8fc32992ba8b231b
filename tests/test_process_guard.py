"""The guard (openmanus_rl_core.process.guard) run for real: a child, the processes it leaves, a launcher killed with
SIGKILL. The guard's poll of its launcher is set to a minute here, so only its handling of the child's own exit can
be what ends the leftovers within the bounds below."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from kills import alive, pids_in, wait_for

from openmanus_rl_core.process.guard import guarded


def test_the_guard_exits_with_its_childs_code_and_kills_what_the_child_left_running(tmp_path):
    left = tmp_path / "left"
    child = ["sh", "-c", f"sleep 1000 & echo $! > {left}; exit 3"]
    done = subprocess.run(guarded(child, poll=60), start_new_session=True, timeout=30)
    [sleep_pid] = pids_in(left)
    try:
        assert done.returncode == 3
        assert not alive(sleep_pid)  # gone before the guard returned: no wait needed
    finally:
        if alive(sleep_pid):  # only if the test failed
            os.kill(sleep_pid, signal.SIGKILL)


def test_a_child_that_dies_because_its_launcher_was_killed_leaves_nothing_running(tmp_path):
    # The child writes to its stderr, a pipe to the launcher, until that breaks: the launcher's SIGKILL is what ends
    # it, long before the guard's minute-long poll would notice the launcher is gone.
    pids = tmp_path / "pids"
    child = textwrap.dedent(f"""
        import os, subprocess, sys, time
        sleeper = subprocess.Popen(["sleep", "1000"])
        with open({str(pids)!r}, "a") as f:
            f.write(f"{{os.getpid()}} {{sleeper.pid}}\\n")
        while True:
            print("working", file=sys.stderr, flush=True)
            time.sleep(0.01)
    """)
    launcher = textwrap.dedent(f"""
        import subprocess, sys, time
        from openmanus_rl_core.process.guard import guarded
        guard = subprocess.Popen(guarded([sys.executable, "-c", {child!r}], poll=60), start_new_session=True,
                                 stderr=subprocess.PIPE)
        print(guard.pid, flush=True)
        time.sleep(1000)
    """)
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    guard_pid = int(proc.stdout.readline())
    try:
        assert wait_for(lambda: len(pids_in(pids)) == 2, within=30.0), "the child did not start"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        assert wait_for(lambda: not any(alive(p) for p in [guard_pid, *pids_in(pids)]), within=10.0), \
            [p for p in [guard_pid, *pids_in(pids)] if alive(p)]
    finally:
        for pid in [guard_pid, *pids_in(pids)]:  # only if the test failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
