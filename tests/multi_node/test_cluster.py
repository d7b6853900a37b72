"""The shared cluster itself: several nodes on one machine, every one of them on loopback."""

from __future__ import annotations

import os

import ray

from .conftest import LOOPBACK, SPREAD, inet_addresses


def test_every_node_and_every_socket_of_the_cluster_is_on_loopback(nodes):
    """Ray's node table lists the head and the GPU nodes, all at 127.0.0.1, each with its own
    resources; no process of the cluster (nor this driver) has a socket off loopback."""
    alive = [n for n in ray.nodes() if n["Alive"]]
    gpu_nodes = len(nodes.gpu_node_ids())
    assert gpu_nodes > SPREAD and len(alive) == 1 + gpu_nodes
    assert {n["NodeManagerAddress"] for n in alive} == {"127.0.0.1"}
    assert sorted(n["Resources"].get("GPU", 0.0) for n in alive) == [0.0] + [1.0] * gpu_nodes
    assert ray.util.get_node_ip_address() == "127.0.0.1"  # this process joined over loopback
    sockets = inet_addresses(nodes.processes() | {os.getpid()})
    assert any(status == "LISTEN" for _, status in sockets)
    assert {ip for ip, _ in sockets} <= set(LOOPBACK), sockets
