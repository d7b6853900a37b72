"""Offers engine 'twin' (so does rlweave-testplug-twin-a)."""
from rlweave.plugins import EngineRecord, hookimpl


@hookimpl
def rlweave_inference_engines():
    return [EngineRecord(name="twin", summary="twin from b", target="x:y")]
