"""Errors raised when a run selects a plugin that cannot be used.

All derive from :class:`PluginError` (a ``LookupError``), so config validation can catch
one type and turn it into a ``<file>: <path>: <message>`` line. Each message is meant to
be read by a user: it names the choices, who provides them, and what to do.
"""

from __future__ import annotations


class PluginError(LookupError):
    """A selected plugin name cannot be resolved to a usable record."""

    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownPluginError(PluginError):
    """No loaded plugin offers this name in this kind."""


class PluginConflictError(PluginError):
    """Two plugins (distributions) offer the same name in one kind."""


class PluginUnavailableError(PluginError):
    """The name is offered by a plugin that is broken, incompatible or disabled."""
