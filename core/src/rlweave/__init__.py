"""rlweave: a post-training framework for LLMs built from plugins.

Importing this package is cheap: it never imports torch, ray or an inference engine.
Heavy code lives in submodules that are imported only when a run needs them.
"""

__version__ = "0.1.0"

#: Version of the plugin contract (hookspecs and record types). A plugin declares the
#: version it was built for in every record; a mismatch marks it ``incompatible``.
PLUGIN_API_VERSION = 1

__all__ = ["__version__", "PLUGIN_API_VERSION"]
