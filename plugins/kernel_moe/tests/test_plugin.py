"""The ``moe_groupgemm`` record through the real plugin manager, and a light ``plugin`` module."""

from __future__ import annotations

import subprocess
import sys

from rlweave.plugins.manager import PluginManager


def test_record_listed_available_and_loadable():
    pm = PluginManager()
    assert "moe_groupgemm" in pm.names("kernel")
    record = pm.get("kernel", "moe_groupgemm")
    assert record.kind == "kernel" and record.target == "rlweave_kernel_moe.kernel:KERNEL"
    assert record.probe() is None
    assert pm.availability(record) == ("ok", None)
    provided = [p for p in pm.providers("kernel") if p.name == "moe_groupgemm"]
    assert len(provided) == 1 and provided[0].plugin.distribution == "rlweave-kernel-moe"
    kernel = record.load()
    from rlweave_kernel_moe.kernel import KERNEL

    assert kernel is KERNEL and kernel.implementation("cpu") in kernel.implementations


def test_plugin_module_and_probe_import_no_torch():
    code = ("import sys, rlweave_kernel_moe.plugin as p; r = p.rlweave_kernels()[0]; "
            "assert r.probe() is None; "
            "bad = [m for m in ('torch', 'triton', 'transformers') if m in sys.modules]; "
            "assert not bad, bad; print('light')")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "light" in out.stdout, out.stderr
