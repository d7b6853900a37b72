"""Built for another plugin-API version."""
from rlweave.plugins import EngineRecord, hookimpl


@hookimpl
def rlweave_inference_engines():
    return [EngineRecord(name="oldengine", summary="old engine", target="x:y", api_version=99)]
