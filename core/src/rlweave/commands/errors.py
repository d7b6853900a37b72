"""User-facing errors of the commands: one line on stderr, exit code 2, no traceback.

A command raises :class:`CommandError` for anything the user can fix (a missing file, a
malformed record, an incomplete checkpoint, an existing output directory, an unknown plugin
name) and runs its body inside :func:`user_errors`, which prints ``error: <message>`` and
exits with code 2. A :class:`~rlweave.config.errors.ConfigError` is printed as ``rlweave
validate`` prints it (every problem, one per line), also with code 2. Anything else is a bug
or a failure of the model/engine and propagates with its traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer


class CommandError(Exception):
    """Bad input to a command; the message names the file, record, option or checkpoint."""


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn :class:`CommandError` and ``ConfigError`` into a message on stderr and exit code 2;
    :class:`~rlweave.rewards.failures.RewardFailureError` (rewards failing on too many samples)
    into one line and exit code 1, as ``rlweave train`` does."""
    from rlweave.config.errors import ConfigError
    from rlweave.rewards.failures import RewardFailureError

    try:
        yield
    except CommandError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    except RewardFailureError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
