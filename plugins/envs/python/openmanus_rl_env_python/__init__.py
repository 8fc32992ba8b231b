"""The ``python`` env for openmanus-rl: a plain Python class whose public methods are the tools (see
:mod:`openmanus_rl_env_python.env`)."""

from openmanus_rl_env_python.env import PythonEnv, class_spec, load_class
from openmanus_rl_env_python.schema import function_schema

__all__ = ["PythonEnv", "class_spec", "load_class", "function_schema"]
