"""Run one Ray worker node in this process until SIGTERM, every address on loopback.

What ``ray start --address=... --block`` does (the same ``ray._private.node.Node``), for a
cluster bound to 127.0.0.1: ``ray start`` cannot join one, it replaces a loopback address with
the machine's own IP (and, with loopback kept, refuses to start a second node).

The multi-node tests start it under ``unshare --mount`` after mounting an empty tmpfs over a
directory: the node's raylet and every worker process it starts live in that mount namespace and
see the empty tmpfs where the rest of the machine sees the directory's files, as a node that
does not mount a shared filesystem would.

Usage: ``python private_node.py GCS_ADDRESS NUM_GPUS``. Prints one JSON line ``{"node_id": ...}``
once the node runs; SIGTERM stops the node's processes (the worker processes end with their
raylet) and exits.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def main(gcs_address: str, num_gpus: int) -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray resolves this machine to 127.0.0.1
    import ray._private.node
    from ray._private import ray_constants
    from ray._private.parameter import RayParams

    ray_constants.ENABLE_RAY_CLUSTER = False
    params = RayParams(gcs_address=gcs_address, node_ip_address="127.0.0.1", num_cpus=1, num_gpus=num_gpus,
                       object_store_memory=150 * 1024 * 1024, min_worker_port=0, max_worker_port=0,
                       node_manager_port=0, include_log_monitor=False)
    params.dashboard_agent_listen_port = None  # any free port: the head's agent has the default one
    node = ray._private.node.Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    print(json.dumps({"node_id": node.node_id}), flush=True)
    while True:  # Node's SIGTERM handler stops its processes and exits
        signal.pause()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
