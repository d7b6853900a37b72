"""The machine a benchmark ran on, for its header line (light: no torch)."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_name() -> str:
    """CPU model with its bf16-relevant extensions and core count, e.g.
    'AMD EPYC (avx512_bf16, avx512f), 2 cores' or 'AMD EPYC (AVX2 only), 2 cores'."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    ext = [f for f in ("amx_bf16", "avx512_bf16", "avx512f") if f in flags]
    ext_text = ", ".join(ext) if ext else ("AVX2 only" if "avx2" in flags else "no AVX2")
    return f"{model} ({ext_text}), {os.cpu_count()} cores"


def gpu_name() -> str | None:
    """The GPUs ``nvidia-smi`` lists, e.g. 'NVIDIA H200'; ``None`` where there is none (or no
    ``nvidia-smi``)."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [n.strip() for n in out.splitlines() if n.strip()]
    if not names:
        return None
    return names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"
