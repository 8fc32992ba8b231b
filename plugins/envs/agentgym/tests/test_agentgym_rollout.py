"""A real AgentGym-protocol server killed in the middle of a rollout: the AgentLoop ends only the episodes on that
server (termination env_error, with the server's URL), excludes them from the loss, finishes the rest, and the
launcher's watchdog brings the server back for the next rollout."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.protocols import Generation
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, build_batch
from openmanus_rl_env_agentgym import AgentGymEnv

from test_agentgym_client import fake_launcher

# The fake server's game: task d is won by counting up to 1 + d % 3; tasks 2, 5, 8, ... take look, inc, inc, inc.
SCRIPT = ["look", "inc", "inc", "inc"]


class TurnScriptedEngine:
    """Replies with the scripted action of the current turn (the model is not what this test is about); calls
    ``on_turn(turn)`` before answering, which is where the test kills a server."""

    def __init__(self, tokenizer, template, on_turn=lambda turn: None):
        self.tok, self.template, self.on_turn, self.turn = tokenizer, template, on_turn, 0

    def generate(self, prompts, params):
        self.on_turn(self.turn)
        text = self.template.render(SCRIPT[min(self.turn, len(SCRIPT) - 1)])
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        self.turn += 1
        return [Generation(list(ids), [-0.1] * len(ids), text, "stop") for _ in prompts]

    def update_weights(self, state_dict):
        pass


def _env_factory(urls):
    counter, lock = itertools.count(), threading.Lock()

    def make():
        with lock:
            i = next(counter)
        return AgentGymEnv("textcraft", base_url=urls[i % len(urls)], timeout=5, retries=0, retry_backoff=0.01)

    return make


def test_server_killed_mid_rollout_ends_only_its_episodes_and_is_restarted():
    template = registry("template").build("react")
    tok = build_tokenizer([template.render(a) for a in SCRIPT] + ["look inc done counter value"], vocab_size=300)
    cfg = RolloutConfig(max_turns=4, max_new_tokens=32, env_timeout_s=10)
    servers = fake_launcher("id", num_servers=2)
    with servers:
        dead_port, dead_url = servers.ports[0], servers.urls[0]

        def kill_first_server(turn):
            if turn == 2:  # after two completed steps on every episode
                os.killpg(servers.pid(dead_port), signal.SIGKILL)
                while servers.healthy(dead_port):
                    time.sleep(0.02)

        tasks = [{"task_id": 3 * i + 2, "seed": 0} for i in range(6)]
        loop = AgentLoop(TurnScriptedEngine(tok, template, kill_first_server), tok, template,
                         _env_factory(servers.urls), cfg)
        episodes = loop.run(tasks)

        on_dead = [e for e in episodes if e.trajectory.turns and e.trajectory.turns[0].info.get("server") == dead_url]
        alive = [e for e in episodes if e not in on_dead]
        assert len(on_dead) == 3 and len(alive) == 3
        for e in on_dead:
            assert e.trajectory.termination == "env_error"
            assert dead_url in e.trajectory.error
            # the two completed steps are kept, and the reply whose step failed, with no observation
            assert [t.observation == "" for t in e.trajectory.turns] == [False, False, True]
        for e in alive:
            assert e.trajectory.termination == "done" and e.trajectory.success is True

        batch = build_batch(episodes, None, registry("allocator").build("last_token"), tok.pad_token_id)
        dead_rows = [i for i, e in enumerate(episodes) if e in on_dead]
        live_rows = [i for i, e in enumerate(episodes) if e in alive]
        assert batch["response_mask"][dead_rows].sum().item() == 0  # excluded from the loss
        assert all(batch["response_mask"][i].sum().item() > 0 for i in live_rows)

        # The watchdog restarts the killed server; the next rollout uses both servers again.
        servers.start_watchdog(interval=0.1)
        deadline = time.monotonic() + 30
        while not servers.healthy(dead_port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert servers.healthy(dead_port), "the watchdog did not restart the killed server"
        again = AgentLoop(TurnScriptedEngine(tok, template), tok, template, _env_factory(servers.urls), cfg).run(tasks)
        assert [e.trajectory.termination for e in again] == ["done"] * 6
        assert {e.trajectory.turns[0].info.get("server") for e in again} == set(servers.urls)
