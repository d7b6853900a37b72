"""Config: core schema (pass one), plugin sections (pass two), input checks, overrides, run directory.

Light: importing it never imports torch or ray.
"""

from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.config.resolve import resolve_plugins
from rlweave.config.rundir import write_run_dir

__all__ = ["ConfigError", "load_config", "resolve_plugins", "write_run_dir"]
