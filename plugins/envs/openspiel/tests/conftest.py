"""The repository's tests/conftest.py fixtures here too: ``ray_local`` and ``command_here`` (a command run in this
process on the module's local Ray), and ``process_state_kept`` (what such a run changed is put back)."""
import runpy
from pathlib import Path

globals().update({k: v for k, v in runpy.run_path(str(Path(__file__).resolve().parents[4] / "tests" / "conftest.py"),
                                                  run_name="omrl_tests_conftest").items() if not k.startswith("__")})
