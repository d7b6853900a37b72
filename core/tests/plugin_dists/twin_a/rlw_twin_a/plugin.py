"""Offers engine 'twin' (so does rlweave-testplug-twin-b)."""
from rlweave.plugins import EngineRecord, hookimpl


@hookimpl
def rlweave_inference_engines():
    return [EngineRecord(name="twin", summary="twin from a", target="x:y")]
