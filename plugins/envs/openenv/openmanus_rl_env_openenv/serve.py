"""One OpenEnv server: ``python -m openmanus_rl_env_openenv.serve module:attr --port P`` imports the env's app
(openenv-core's ``create_app``) and serves it with uvicorn on 127.0.0.1. The plugin starts it under the core's
guard (:mod:`openmanus_rl_core.process.guard`), which stops it when the trainer dies."""

from __future__ import annotations

import argparse
import importlib
import sys

import uvicorn
from openmanus_rl_core.process import heap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openmanus_rl_env_openenv.serve")
    parser.add_argument("app", help="module:attr of the env's ASGI app")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    # An env that reads sys.argv itself (argparse's parse_known_args) sees only the port, as under its own CLI.
    sys.argv = [sys.argv[0], "--port", str(args.port)]
    module, attr = args.app.split(":")
    app = getattr(importlib.import_module(module), attr)
    heap.freeze()  # the app's imports (openenv-core's, gradio's): no full collection walks them between two steps
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
