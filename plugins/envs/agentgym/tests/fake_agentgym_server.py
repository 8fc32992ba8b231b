"""A stand-in AgentGym env server for the client's tests: a real FastAPI app served by uvicorn.

    python fake_agentgym_server.py --port P --shape id|env_idx [--prefix /maze] [--chaos] [--no-close]
        [--final-reward R] [--need-file PATH] [--broken-reset-after N]

The game ("count up"): task ``d`` has goal ``1 + d % 3``. Actions: ``inc`` (position + 1), ``look``; anything
else is answered "Nothing happens." Reaching the goal ends the episode; so does running out of 10 steps. Tasks
``d >= 1000`` open with a long TextCraft-like observation: 60 recipe lines, then the goal in the LAST line.
``--final-reward R``: the goal step's reward is R instead of 1.0 (BabyAI pays less than 1 for a finished mission).
``--need-file PATH``: exit at start unless PATH exists relative to the working directory (the real TextCraft
server reads its recipes that way). ``--broken-reset-after N``: every ``/reset`` after the first N answers an error
body (a server that is up but whose envs then all fail). ``GET /_stats`` (this fake only) counts created, closed and live envs.

Request shapes, as the real servers use them (see WooooDyy/AgentGym agentenv-*/):

- ``id`` (TextCraft/BabyAI/SciWorld/LMRL-Gym style): ``POST /create -> {"id": n}``;
  ``POST /reset {"id", "data_idx"|"game"|"seed"} -> {"id", "observation", "reward": 0, "done": false}``;
  ``POST /step {"id", "action"} -> {"observation", "reward", "done"}`` with reward 1.0 on the step that reaches
  the goal (per-step reward); ``GET /observation?id=n``.
- ``env_idx`` (WebShop/SQLGym style): ``POST /create -> n``; ``POST /reset {"env_idx", "session_id"|...}
  -> [observation, null]``; ``POST /step {"env_idx", "action"} -> {"state", "reward", "done", "info"}`` with the
  reward the running progress ``position / goal`` (like the tool envs' progress rate);
  ``GET /observation?env_idx=n``; ``POST /close {"env_idx"} -> {"closed": bool}``.

Failures are answered like the real servers do: HTTP 200 with ``{"error": "..."}`` (unknown id, stepping a
finished episode, a malformed body). With ``--chaos`` some actions misbehave on purpose: ``__error__`` (error
body), ``__hang__ <seconds>`` (sleeps, default 30), ``__garbage__`` (a non-JSON 200), ``__500__`` (HTTP 500),
``__flaky__`` (HTTP 503 on every other call), ``__die__`` (the process exits at once), ``__trickle__`` (a
valid answer sent one byte every 0.2 s), ``__deep__`` (an answer nested 100,000 deep), ``__strdone__`` (``"done":
"false"``, a string). Both shapes serve ``POST /close`` (the real TextCraft and BabyAI servers do) unless
``--no-close``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

MAX_STEPS = 10
INDEX_KEYS = ("data_idx", "game", "seed", "session_id", "item_id", "idx", "id")


class Game:
    def __init__(self, data_idx: int):
        self.data_idx = data_idx
        self.goal = 1 + data_idx % 3
        self.pos = 0
        self.steps = 0
        self.done = False

    def first_observation(self) -> str:
        if self.data_idx >= 1000:
            recipes = "\n".join(f"craft 1 item_{i} using 2 part_{i}, 1 part_{i + 1}" for i in range(60))
            return f"Crafting commands:\n{recipes}\n\nGoal: count up to {self.goal}."
        return f"Task {self.data_idx}: count up to {self.goal}. Actions: inc, look. You are at 0."

    def step(self, action: str) -> str:
        self.steps += 1
        verb = action.strip().lower()
        if verb == "inc":
            self.pos += 1
            obs = f"You are at {self.pos}."
        elif verb == "look":
            obs = f"You are at {self.pos}; the goal is {self.goal}."
        else:
            obs = "Nothing happens. Valid actions: inc, look."
        if self.pos >= self.goal:
            self.done = True
            obs = f"You reached {self.goal}. Task complete."
        elif self.steps >= MAX_STEPS:
            self.done = True
            obs += " Out of steps."
        return obs


def build_app(shape: str, prefix: str = "", chaos: bool = False, close: bool = True,
              final_reward: float = 1.0, broken_reset_after: int | None = None) -> FastAPI:
    app = FastAPI()
    router = APIRouter()
    games: dict[int, Game | None] = {}  # None: created, not reset yet
    counter = {"next": 0, "flaky": 0, "closed": 0, "resets": 0}
    key = "id" if shape == "id" else "env_idx"

    async def body_of(request: Request) -> dict[str, Any] | None:
        try:
            data = json.loads(await request.body() or b"{}")
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    async def game_request(request: Request) -> tuple[dict[str, Any], int | None, str | None]:
        """The request's JSON object, the game id it names, and an error message when either is bad."""
        data = await body_of(request)
        if data is None:
            return {}, None, "the body must be a JSON object"
        env_id = data.get(key)
        if not isinstance(env_id, int) or isinstance(env_id, bool) or env_id not in games:
            return data, None, f"The id {env_id!r} is not valid."
        return data, env_id, None

    @app.get("/")
    async def hello() -> str:
        return f"This is the fake AgentGym server ({shape} shape)."

    @app.get("/_stats")
    async def stats() -> dict:
        return {"created": counter["next"], "closed": counter["closed"], "live": len(games)}

    @router.post("/create")
    async def create() -> Any:
        env_id = counter["next"]
        counter["next"] += 1
        games[env_id] = None
        return {"id": env_id} if shape == "id" else env_id

    @router.post("/reset")
    async def reset(request: Request) -> Any:
        data, env_id, err = await game_request(request)
        counter["resets"] += 1
        if err or (broken_reset_after is not None and counter["resets"] > broken_reset_after):
            return {"error": err or "reset failed on purpose"}
        index = next((data[k] for k in INDEX_KEYS if k != key and k in data), None)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            return {"error": f"bad data index {index!r}"}
        game = games[env_id] = Game(index)
        if shape == "id":
            return {"id": env_id, "observation": game.first_observation(), "reward": 0, "done": False}
        return [game.first_observation(), None]

    @router.post("/step")
    async def step(request: Request) -> Any:
        data, env_id, err = await game_request(request)
        if err:
            return {"error": err}
        action = data.get("action")
        if not isinstance(action, str):
            return {"error": f"action must be a string, got {type(action).__name__}"}
        if chaos:
            if action == "__error__":
                return {"error": "the environment broke on purpose"}
            if action.startswith("__hang__"):
                arg = action[len("__hang__"):].strip()
                await asyncio.sleep(float(arg) if arg else 30.0)
            if action == "__garbage__":
                return PlainTextResponse("<html>Internal hiccup</html>")
            if action == "__500__":
                return PlainTextResponse("Internal Server Error", status_code=500)
            if action == "__flaky__":
                counter["flaky"] += 1
                if counter["flaky"] % 2:
                    return PlainTextResponse("busy", status_code=503)
                action = "look"
            if action == "__die__":
                os._exit(3)
            if action == "__trickle__":
                async def slowly():
                    for ch in json.dumps({"observation": "slow", "reward": 0, "done": False}):
                        yield ch.encode()
                        await asyncio.sleep(0.2)
                return StreamingResponse(slowly(), media_type="application/json")
            if action == "__deep__":
                return PlainTextResponse("[" * 100_000 + "]" * 100_000, media_type="application/json")
            if action == "__strdone__":
                return {"observation": "You are here.", "reward": 0, "done": "false"}
        game = games[env_id]
        if game is None:
            return {"error": f"The task with environment {env_id} has not been reset."}
        if game.done:
            return {"error": f"The task with environment {env_id} has finished."}
        before = game.pos
        obs = game.step(action)
        if shape == "id":
            reward = final_reward if game.pos >= game.goal > before else 0.0
            return {"observation": obs, "reward": reward, "done": game.done}
        return {"state": obs, "reward": min(game.pos, game.goal) / game.goal, "done": game.done, "info": None}

    @router.get("/observation")
    async def observation(request: Request) -> Any:
        try:
            env_id = int(request.query_params.get(key, ""))
        except ValueError:
            return {"error": f"query parameter {key!r} must be an int"}
        game = games.get(env_id)
        if game is None:
            return {"error": f"The id {env_id} is not valid."}
        return game.first_observation() if game.steps == 0 else f"You are at {game.pos}."

    if close:

        @router.post("/close")
        async def close_env(request: Request) -> Any:
            data = await body_of(request) or {}
            env_id = data.get(key)
            closed = isinstance(env_id, int) and games.pop(env_id, 0) != 0
            counter["closed"] += closed
            return {"closed": closed} if shape == "env_idx" else closed

    @app.exception_handler(Exception)
    async def never_crash(request: Request, exc: Exception) -> JSONResponse:  # an error body, like the real ones
        return JSONResponse({"error": f"{type(exc).__name__}: {exc}"})

    app.include_router(router, prefix=prefix.rstrip("/"))
    return app


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--shape", choices=["id", "env_idx"], default="id")
    p.add_argument("--prefix", default="")
    p.add_argument("--chaos", action="store_true")
    p.add_argument("--no-close", action="store_true")
    p.add_argument("--final-reward", type=float, default=1.0)
    p.add_argument("--need-file", default=None)
    p.add_argument("--broken-reset-after", type=int, default=None)
    a = p.parse_args()
    if a.need_file and not os.path.exists(a.need_file):
        raise SystemExit(f"fake server: {a.need_file} not found under {os.getcwd()}")
    uvicorn.run(build_app(a.shape, a.prefix, a.chaos, not a.no_close, a.final_reward, a.broken_reset_after), host=a.host,
                port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
