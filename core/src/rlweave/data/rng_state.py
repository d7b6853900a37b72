"""Random-number-generator states as plain data, never as pickles.

:func:`get_state` captures Python's ``random``, NumPy's global generator and torch's CPU
generator (and each CUDA device's, when CUDA is initialised); :func:`set_state` restores
them, so a resumed run draws the same numbers as an uninterrupted one. The state travels in
one of two carriers:

* :func:`to_json` / :func:`from_json`: one JSON object (torch states as base64 bytes), what
  the controller writes as ``rng.json``;
* :func:`split` / :func:`join`: a JSON object plus ``{name: uint8 tensor}`` for a safetensors
  file, what the FSDP backend writes per rank.

Every reader validates types and sizes and raises :class:`ValueError` naming ``source`` and
the field; nothing read is ever executed. torch and NumPy are imported inside the functions.

JSON form (``format`` 1)::

    {"format": 1,
     "python": {"version": 3, "state": [625 ints], "gauss_next": null},
     "numpy": {"kind": "MT19937", "keys": [624 ints], "pos": 624, "has_gauss": 0, "cached_gaussian": 0.0},
     "tensors": {"torch": "<base64>", "cuda.0": "<base64>", ...}}     # to_json only
"""

from __future__ import annotations

import base64
import random
from typing import Any

FORMAT = 1
_U32 = 1 << 32


def get_state() -> dict[str, Any]:
    """``{"python", "numpy", "torch", "cuda"?}``: the live states (``cuda``: one tensor per
    device, only when CUDA is initialised in this process)."""
    import numpy as np
    import torch

    st: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_state(st: dict[str, Any]) -> None:
    """Restore what :func:`get_state` (or :func:`join` / :func:`from_json`) returned. CUDA
    states are restored for the devices present (none without CUDA)."""
    import numpy as np
    import torch

    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if st.get("cuda") and torch.cuda.is_available():
        for i, t in enumerate(st["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(t, device=i)


def split(st: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(json_object, tensors)``: Python and NumPy states as JSON, the torch states as uint8
    CPU tensors named ``torch`` and ``cuda.<i>``."""
    version, internal, gauss = st["python"]
    kind, keys, pos, has_gauss, cached = st["numpy"]
    obj = {
        "format": FORMAT,
        "python": {"version": int(version), "state": [int(x) for x in internal], "gauss_next": gauss},
        "numpy": {"kind": str(kind), "keys": [int(x) for x in keys], "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
    }
    tensors = {"torch": st["torch"].detach().cpu().contiguous()}
    for i, t in enumerate(st.get("cuda") or []):
        tensors[f"cuda.{i}"] = t.detach().cpu().contiguous()
    return obj, tensors


def _fail(source: str, what: str) -> ValueError:
    return ValueError(f"{source}: invalid RNG state: {what}")


def _ints(value: Any, n: int, source: str, field: str) -> list[int]:
    if not (isinstance(value, list) and len(value) == n and all(type(x) is int and 0 <= x < _U32 for x in value)):
        raise _fail(source, f"{field} must be a list of {n} unsigned 32-bit integers")
    return value


def join(obj: Any, tensors: dict[str, Any], source: str = "RNG state") -> dict[str, Any]:
    """The state :func:`set_state` takes, from what :func:`split` returned (read back from
    JSON and safetensors). Raises ValueError naming ``source`` when anything is malformed."""
    import numpy as np
    import torch

    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise _fail(source, f"expected a JSON object with \"format\": {FORMAT}")
    py, npy = obj.get("python"), obj.get("numpy")
    if not isinstance(py, dict) or type(py.get("version")) is not int:
        raise _fail(source, "python.version missing")
    state = _ints(py.get("state"), 625, source, "python.state")
    gauss = py.get("gauss_next")
    if gauss is not None and type(gauss) is not float:
        raise _fail(source, "python.gauss_next must be null or a number")
    if not isinstance(npy, dict) or npy.get("kind") != "MT19937":
        raise _fail(source, "numpy.kind must be \"MT19937\"")
    keys = _ints(npy.get("keys"), 624, source, "numpy.keys")
    pos, has_gauss, cached = npy.get("pos"), npy.get("has_gauss"), npy.get("cached_gaussian")
    if type(pos) is not int or not 0 <= pos <= 624 or has_gauss not in (0, 1) or type(cached) not in (int, float):
        raise _fail(source, "numpy.pos / has_gauss / cached_gaussian out of range")
    for name, t in tensors.items():
        if not (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1):
            raise _fail(source, f"tensor {name!r} must be a 1-D uint8 tensor")
    if "torch" not in tensors:
        raise _fail(source, "the torch CPU generator state is missing")
    n_cuda = sum(k.startswith("cuda.") for k in tensors)
    cuda = [tensors.get(f"cuda.{i}") for i in range(n_cuda)]
    if any(t is None for t in cuda) or set(tensors) - {"torch", *(f"cuda.{i}" for i in range(n_cuda))}:
        raise _fail(source, f"unexpected tensor names {sorted(tensors)}")
    out: dict[str, Any] = {
        "python": (py["version"], tuple(state), gauss),
        "numpy": ("MT19937", np.asarray(keys, dtype=np.uint32), pos, has_gauss, float(cached)),
        "torch": tensors["torch"],
    }
    if cuda:
        out["cuda"] = cuda
    return out


def to_json(st: dict[str, Any]) -> dict[str, Any]:
    """One JSON object holding ``st`` (torch states base64-encoded under ``tensors``)."""
    obj, tensors = split(st)
    obj["tensors"] = {k: base64.b64encode(t.numpy().tobytes()).decode("ascii") for k, t in tensors.items()}
    return obj


def from_json(obj: Any, source: str = "RNG state") -> dict[str, Any]:
    """The state :func:`set_state` takes, from :func:`to_json`'s object (validated)."""
    import torch

    raw = obj.get("tensors") if isinstance(obj, dict) else None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise _fail(source, "\"tensors\" must map names to base64 strings")
    tensors = {}
    for k, v in raw.items():
        try:
            data = base64.b64decode(v.encode("ascii"), validate=True)
        except ValueError as exc:
            raise _fail(source, f"tensors.{k} is not base64 ({exc})") from None
        tensors[k] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return join({k: v for k, v in obj.items() if k != "tensors"}, tensors, source)
