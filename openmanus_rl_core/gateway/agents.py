"""Running the user's agent once per episode against the gateway (``agent.command`` or ``agent.function``).

:func:`run_agents` runs one agent per :class:`AgentJob`, up to ``agent.max_concurrent`` at once, and returns one
:class:`AgentOutcome` per job, in job order. It is synchronous: all agents run in one fresh event loop.

- ``agent.command``: the program (shell words, split with :func:`shlex.split`, not run by a shell) runs with this
  process's environment plus ``OPENAI_BASE_URL`` (the gateway, ending in ``/v1``), ``OPENAI_API_KEY`` (the
  episode's key), ``OMRL_MODEL`` (the policy's name) and ``OMRL_TASK`` (the task row as JSON), the same for the
  Anthropic SDK (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``) and the OpenAI Agents SDK (``OPENAI_DEFAULT_MODEL``;
  ``OPENAI_AGENTS_DISABLE_TRACING=1`` unless set): :func:`agent_env`. The last :data:`STDERR_TAIL_CHARS`
  characters of its stderr and of its stdout are kept (whole lines): the outcome carries both, the log the stderr.
  Each agent runs in its own process group under :mod:`openmanus_rl_core.process.guard`, so a timeout or an
  abandon kills the agent and every process it started (SIGTERM, then SIGKILL after :data:`KILL_GRACE_S`), and a
  launcher killed with SIGKILL takes its agents with it. A non-zero exit is the error ``exited N: <stderr tail>``.
- ``agent.function``: ``pkg.mod:fn``, an ``async def fn(client, task)`` returning the episode's reward (a real
  number) or None; ``client`` is an ``openai.AsyncOpenAI`` on the gateway with the episode's key. A function that
  declares a ``model`` parameter is also given the policy's name as ``model=``. A raised exception is the error
  ``raised <Type>: <message>``; a timeout cancels the coroutine (a function that blocks the event loop cannot be
  interrupted: it must await).

An agent running longer than ``agent.timeout_s`` is stopped with the error ``timed out after <t>s (killed)``
(``(cancelled)`` for a function). When ``abandon()`` (polled every :data:`ABANDON_POLL_S`) returns True, every
running agent is stopped and each unfinished job's error is ``abandoned``. Every error but ``abandoned`` is also one
``log`` line naming the task. When :func:`run_agents` returns or raises, no agent process is left: each agent's
whole process group is waited for after its SIGKILL (at most :data:`GONE_WAIT_S`; a process that still does not go,
one stuck in the kernel, is one ``log`` line naming its pids).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import numbers
import os
import shlex
import shutil
import signal
import ssl
import time
import traceback
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.process.guard import group_members, guarded

KILL_GRACE_S = 2.0  # seconds between SIGTERM to an agent's process group and SIGKILL
GONE_WAIT_S = 5.0  # how long a SIGKILLed group may take to go (the signal is delivered asynchronously)
STDERR_TAIL_CHARS = 2000  # how much of a command agent's stderr (and of its stdout) is kept
ABANDON_POLL_S = 0.2
_GUARD_POLL_S = 0.5  # how soon an agent notices that the process running run_agents was killed
_EXIT_POLL_S = 0.02  # how often a running agent's exit status is looked at
Running = Callable[[str, bool], None]  # told (key, True) when an episode's agent starts, (key, False) when it ends


@dataclass
class AgentJob:
    """One episode: ``key`` is its API key (it names the episode at the gateway), ``task`` the task row (JSON-able)
    given to the agent."""

    key: str
    task: dict


@dataclass
class AgentOutcome:
    """How one agent ended. ``reward``: the function's return value (None when it returned None, for a command, or
    on an error); ``error``: None when the agent ended normally, else one line (``timed out after 30s (killed)``,
    ``exited 3: <stderr tail>``, ``raised ValueError: ...``, ``abandoned``); ``seconds``: its running time; for a
    command, ``exit`` its exit status (128 + N: ended by signal N; None: it never started) and ``stdout`` /
    ``stderr`` the tails of its output (a function has neither)."""

    key: str
    reward: float | None
    error: str | None
    seconds: float
    exit: int | None = None
    stdout: str = ""
    stderr: str = ""


@dataclass
class _Ended:
    """What a command runner reports of an agent that ended with status 0 (a function runner reports its reward)."""

    exit: int
    stdout: str
    stderr: str


class _AgentFailed(Exception):
    """An agent that ended badly: ``error`` is its outcome's error, ``detail`` what the log line adds; a command's
    exit status and output tails when it ran."""

    def __init__(self, error: str, detail: str = "", exit: int | None = None, stdout: str = "", stderr: str = ""):
        super().__init__(error)
        self.error, self.detail = error, detail
        self.exit, self.stdout, self.stderr = exit, stdout, stderr


def _one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


# ------------------------------------------------------------------------------------------------------ checks
def check_agent(cfg: Any) -> None:
    """Refuse a bad ``agent`` section before anything starts: exactly one of ``command`` and ``function`` set, the
    command's program found, the function importable and async. Raises :class:`ConfigError` in one line naming
    the bad value."""
    if bool(cfg.command) == bool(cfg.function):
        state = "neither is set" if not cfg.command else f"both are set ({cfg.command!r}, {cfg.function!r})"
        raise ConfigError(f"agent: set exactly one of agent.command (a program run once per episode) and "
                          f"agent.function (pkg.mod:fn, an async fn(client, task)); {state}")
    if cfg.command:
        _command_argv(cfg.command)
    else:
        _load_function(cfg.function)


def _command_argv(command: str) -> list[str]:
    where = f"agent.command={command!r}"
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot be split into shell words: {exc}") from None
    if not argv:
        raise ConfigError(f"{where}: names no program; give the program to run once per episode")
    program = argv[0]
    if os.sep not in program:
        if shutil.which(program) is None:
            raise ConfigError(f"{where}: the program {program!r} is not found on PATH; install it or give its path")
    elif not os.path.isfile(program):
        raise ConfigError(f"{where}: the program {program!r} is not found (relative paths start at {os.getcwd()})")
    elif not os.access(program, os.X_OK):
        raise ConfigError(f"{where}: the program {program!r} is not executable; chmod +x it, or run it through its "
                          f"interpreter (agent.command=\"python {command}\")")
    return argv


def _load_function(spec: str) -> Callable[..., Awaitable[Any]]:
    where = f"agent.function={spec!r}"
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigError(f"{where}: expected pkg.mod:fn, an async fn(client, task) -> reward | None")
    try:
        fn: Any = importlib.import_module(module)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # an import may fail in any way, sys.exit() included
        raise ConfigError(f"{where}: cannot be imported: {type(exc).__name__}: {_one_line(str(exc))}") from None
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"{where}: is not an async function (define it as async def fn(client, task))")
    return fn


# ------------------------------------------------------------------------------------------------------ running
def run_agents(jobs: Sequence[AgentJob], cfg: Any, base_url: str, model: str, log: Callable[[str], None],
               abandon: Callable[[], bool] = lambda: False, running: Running = lambda key, now: None
               ) -> list[AgentOutcome]:
    """Run one agent per job (``cfg``: the ``agent`` section) against the gateway at ``base_url``; the outcomes in
    job order; ``running(key, True)`` when a job's agent starts, ``running(key, False)`` when it ends. See the
    module doc for what an agent gets and how it is stopped."""
    groups: set[int] = set()  # the process groups of the agents running now
    run_one = job_runner(cfg, base_url, model, groups, log)
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_run_all(list(jobs), run_one, int(cfg.max_concurrent), log, abandon,
                                                running))
    finally:  # normally a no-op; after an exception in this thread the agents still running end here
        stop_groups(groups, log)
        rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in rest:
            task.cancel()
        if rest:  # bounded: a function that swallows its cancellation must not hold the caller
            loop.run_until_complete(asyncio.wait(rest, timeout=KILL_GRACE_S))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def job_runner(cfg: Any, base_url: str, model: str, groups: set[int],
               log: Callable[[str], None]) -> Callable[[AgentJob], Awaitable[Any]]:
    """The coroutine function that runs one agent of ``cfg`` for one job (what :func:`run_agents` runs per job;
    :func:`run_job` turns it into an outcome). ``groups`` holds the process groups of the commands running now
    (to stop them all at once); ``log`` is told of a process that outlives its group's SIGKILL."""
    if cfg.command:
        return _command_runner(_command_argv(cfg.command), float(cfg.timeout_s), base_url, model, groups, log)
    return _function_runner(_load_function(cfg.function), float(cfg.timeout_s), base_url, model)


def stop_groups(groups: set[int], log: Callable[[str], None]) -> None:
    """SIGKILL to every command agent's process group still running; returns once they are gone (bounded by
    :data:`GONE_WAIT_S`)."""
    pgids = list(groups)
    for pgid in pgids:
        _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + GONE_WAIT_S
    for pgid in pgids:
        while (left := group_members(pgid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        _log_left(pgid, left, log)


async def _group_gone(pgid: int, log: Callable[[str], None]) -> None:
    """Waits until process group ``pgid``, just sent SIGKILL, has no live process (at most :data:`GONE_WAIT_S`)."""
    deadline = time.monotonic() + GONE_WAIT_S
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    _log_left(pgid, left, log)


def _log_left(pgid: int, left: list[int], log: Callable[[str], None]) -> None:
    if left:
        log(f"agent process group {pgid}: pids {', '.join(map(str, left))} still running {GONE_WAIT_S:g}s after "
            f"SIGKILL (stuck in the kernel?); left behind")


async def _run_all(jobs: list[AgentJob], run_one: Callable[[AgentJob], Awaitable[float | None]], max_concurrent: int,
                   log: Callable[[str], None], abandon: Callable[[], bool], running: Running) -> list[AgentOutcome]:
    slots = asyncio.Semaphore(max_concurrent)
    tasks = [asyncio.ensure_future(run_job(job, run_one, slots, log, running)) for job in jobs]
    pending = set(tasks)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=ABANDON_POLL_S)
        if pending and abandon():
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=2 * KILL_GRACE_S)
            break
    return [t.result() if t.done() and not t.cancelled() else AgentOutcome(job.key, None, "abandoned", 0.0)
            for job, t in zip(jobs, tasks)]


async def run_job(job: AgentJob, run_one: Callable[[AgentJob], Awaitable[float | None]], slots: asyncio.Semaphore,
                  log: Callable[[str], None], running: Running = lambda key, now: None) -> AgentOutcome:
    """One job's :class:`AgentOutcome`, its agent run by ``run_one`` once a slot of ``slots`` is free (``running``
    told when it starts and ends)."""
    start = time.monotonic()
    try:
        async with slots:
            start = time.monotonic()  # the agent's own time, not its wait for a slot
            running(job.key, True)
            try:
                ended = await run_one(job)
            finally:
                running(job.key, False)
        if isinstance(ended, _Ended):
            return AgentOutcome(job.key, None, None, time.monotonic() - start, ended.exit, ended.stdout, ended.stderr)
        return AgentOutcome(job.key, ended, None, time.monotonic() - start)
    except asyncio.CancelledError:
        return AgentOutcome(job.key, None, "abandoned", time.monotonic() - start)
    except _AgentFailed as exc:
        task_id = job.task.get("task_id", "?") if isinstance(job.task, dict) else "?"
        log(f"agent for task {task_id}: {exc.error}" + (f"; {exc.detail}" if exc.detail else ""))
        return AgentOutcome(job.key, None, exc.error, time.monotonic() - start, exc.exit, exc.stdout, exc.stderr)


def agent_env(base_url: str, key: str, model: str, task: dict) -> dict[str, str]:
    """A command agent's environment: this process's, plus the gateway for the OpenAI and Anthropic SDKs (their own
    variables), the policy's name as the OpenAI Agents SDK's default model, the task, and the Agents SDK's tracing
    off unless the user set it (it would post every episode's trace elsewhere, with the episode's key)."""
    return {"OPENAI_AGENTS_DISABLE_TRACING": "1", **os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key,
            "OPENAI_DEFAULT_MODEL": model, "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": key, "OMRL_MODEL": model, "OMRL_TASK": json.dumps(task)}


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def _command_runner(argv: list[str], timeout_s: float, base_url: str, model: str, groups: set[int],
                    log: Callable[[str], None]) -> Callable[[AgentJob], Awaitable[_Ended]]:
    async def run(job: AgentJob) -> _Ended:
        env = agent_env(base_url, job.key, model, job.task)
        try:
            proc = await asyncio.create_subprocess_exec(
                *guarded(argv, poll=_GUARD_POLL_S, grace=KILL_GRACE_S), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
                start_new_session=True)  # its own process group: a stop reaches whatever the agent started
        except OSError as exc:
            raise _AgentFailed(f"cannot start {argv[0]!r}: {exc}") from None
        groups.add(proc.pid)
        tail, out_tail = bytearray(), bytearray()
        readers = [asyncio.ensure_future(_keep_tail(proc.stderr, tail)),
                   asyncio.ensure_future(_keep_tail(proc.stdout, out_tail))]  # read on: a full pipe would block it

        def tails() -> dict[str, str]:
            return {"stdout": out_tail.decode(errors="replace"), "stderr": tail.decode(errors="replace")}

        try:
            try:
                rc = await asyncio.wait_for(_exit_code(proc), timeout_s)
            except asyncio.TimeoutError:
                await _stop(proc)
                stderr = _one_line(tail.decode(errors="replace"))
                raise _AgentFailed(f"timed out after {timeout_s:g}s (killed)",
                                   f"stderr tail: {stderr}" if stderr else "", exit=proc.returncode,
                                   **tails()) from None
            except asyncio.CancelledError:
                await _stop(proc)
                raise
        finally:
            _signal_group(proc.pid, signal.SIGKILL)  # what the agent left running when it ended
            await _group_gone(proc.pid, log)
            groups.discard(proc.pid)
            await asyncio.wait(readers, timeout=1.0)  # a process outside the group may still hold its pipes
            for reader in readers:
                reader.cancel()
        if rc != 0:
            raise _AgentFailed(f"exited {rc}: {_one_line(tail.decode(errors='replace')) or '(no stderr)'}", exit=rc,
                               **tails())
        return _Ended(rc, **tails())

    return run


async def _keep_tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    while chunk := await stream.read(65536):
        tail += chunk
        if len(tail) > STDERR_TAIL_CHARS:
            del tail[:-STDERR_TAIL_CHARS]
            del tail[:tail.find(b"\n") + 1]  # whole lines only (nothing when the tail is one long line)


async def _exit_code(proc: asyncio.subprocess.Process) -> int:
    """The agent's exit status as soon as it has exited. ``Process.wait()`` also waits until its pipes close, and a
    process the agent left behind may hold its stderr open; that one is killed with the group afterwards."""
    while proc.returncode is None:
        await asyncio.sleep(_EXIT_POLL_S)
    return proc.returncode


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM to the agent's group, SIGKILL after :data:`KILL_GRACE_S` unless the agent has exited."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_group(proc.pid, sig)
        try:
            await asyncio.wait_for(_exit_code(proc), KILL_GRACE_S)
            return
        except asyncio.TimeoutError:
            pass


def _function_runner(fn: Callable[..., Awaitable[Any]], timeout_s: float, base_url: str,
                     model: str) -> Callable[[AgentJob], Awaitable[float | None]]:
    import openai

    params = inspect.signature(fn).parameters.values()
    own_file = getattr(getattr(fn, "__code__", None), "co_filename", None)
    extra = {"model": model} if any(p.name == "model" or p.kind is p.VAR_KEYWORD for p in params) else {}

    async def boxed(client: Any, task: dict) -> tuple[Any, BaseException | None]:  # the function's own errors
        try:
            return await fn(client, task, **extra), None
        except Exception as exc:
            return None, exc

    # Each episode's client has a connection pool of its own (one pool shared by many concurrent episodes costs
    # time quadratic in them), built on one TLS context (making a context per client costs ~20 ms).
    tls = ssl.create_default_context()

    async def run(job: AgentJob) -> float | None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=job.key, max_retries=0,
                                    http_client=openai.DefaultAsyncHttpxClient(verify=tls))
        try:
            value, exc = await asyncio.wait_for(boxed(client, job.task), timeout_s)
        except asyncio.TimeoutError:
            raise _AgentFailed(f"timed out after {timeout_s:g}s (cancelled)") from None
        finally:
            await client.close()
        if exc is not None:
            frames = traceback.extract_tb(exc.__traceback__)
            frame = next((f for f in reversed(frames) if f.filename == own_file), frames[-1])  # the user's line
            raise _AgentFailed(f"raised {type(exc).__name__}: {_one_line(str(exc))}",
                               f"at {frame.filename}:{frame.lineno} in {frame.name}")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise _AgentFailed(f"returned {value!r} ({type(value).__name__}), not a finite number or None")
        return float(value)

    return run
