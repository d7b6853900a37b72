"""A hook returns something that is not a record."""
from rlweave.plugins import hookimpl


@hookimpl
def rlweave_rewards():
    return ["not a record"]
