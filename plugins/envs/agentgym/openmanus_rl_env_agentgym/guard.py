"""Run one env server and stop it when the process that launched it is gone: :mod:`openmanus_rl_core.process.guard`.

``python -m openmanus_rl_env_agentgym.guard <launcher pid> -- <argv...>`` is kept for the launcher and for
commands written against it; the guard itself lives in the core, which also runs the user's agents under it.
"""

from __future__ import annotations

import sys

from openmanus_rl_core.process.guard import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
