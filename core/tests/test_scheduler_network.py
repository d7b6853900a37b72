"""Addresses: rendezvous stores listen only on the address their clients are told to use, and a
Ray address on loopback is recognised (``start_ray`` joins it over loopback)."""

from __future__ import annotations

import gc
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from rlweave.scheduler.ray_impl.cluster import is_loopback_address  # noqa: E402
from rlweave.rendezvous import listen_socket, tcp_store  # noqa: E402


def listening(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
            if c.status == "LISTEN" and c.laddr.port == port}


def free_port() -> int:
    with listen_socket("127.0.0.1", 0) as s:
        return s.getsockname()[1]


def test_the_master_store_listens_on_its_host_only_and_stops_with_the_store():
    port = free_port()
    timeout = timedelta(seconds=20)
    master = tcp_store("127.0.0.1", port, 2, True, timeout)
    member = tcp_store("127.0.0.1", port, 2, False, timeout)
    member.set("who", "member")
    assert master.get("who") == b"member"
    assert listening(port) == {"127.0.0.1"}  # torch alone listens on "::", every interface
    del master, member
    gc.collect()
    assert listening(port) == set()


def test_a_taken_port_is_an_error_not_a_second_listener():
    with listen_socket("127.0.0.1", 0) as taken:
        with pytest.raises(OSError):
            tcp_store("127.0.0.1", taken.getsockname()[1], 1, True, timedelta(seconds=5))


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1:6379", True), ("localhost:6379", True), ("127.0.0.2:6379", True), ("[::1]:6379", True),
    ("10.0.0.5:6379", False), ("head.cluster:6379", False), ("ray://127.0.0.1:10001", False),
    ("auto", False), (None, False), ("", False),
])
def test_loopback_ray_addresses(address, loopback):
    assert is_loopback_address(address) is loopback
