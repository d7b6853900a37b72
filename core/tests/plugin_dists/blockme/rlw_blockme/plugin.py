"""A healthy plugin that tests block with RLWEAVE_DISABLE_PLUGINS / RLWEAVE_PLUGINS."""
from rlweave.plugins import AlgorithmRecord, hookimpl


@hookimpl
def rlweave_algorithms():
    return [AlgorithmRecord(name="blockalgo", summary="blockable", target="x:y")]
