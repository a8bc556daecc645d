"""The embedded redis-server's port: chosen so that no two servers of one process share it, and
chosen again when another process takes it between the choice and the server's bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sluice.deploy.embedded import EmbeddedRedis, free_port
from sluice.errors import BrokerUnavailable

pytestmark = pytest.mark.integration  # starts redis-server processes


def test_free_port_never_hands_out_the_same_port_twice() -> None:
    """Each socket is closed before the next is bound, so the kernel is free to offer a port
    again; 300 calls in a row still give 300 different ports."""
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_a_chosen_port_taken_by_another_process_first_is_chosen_again(tmp_path: Path) -> None:
    """Something else listens on the port the server was given before it starts: the server
    starts on another port and answers there."""
    server = EmbeddedRedis(tmp_path / "redis")
    taken = server.port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with server:
            assert server.port != taken
            assert server.client().ping()


def test_a_port_the_caller_named_is_not_changed_behind_its_back(tmp_path: Path) -> None:
    """A port given by the caller (a user's own choice) that is taken is an error, not a move."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(BrokerUnavailable, match="redis-server exited"):
            EmbeddedRedis(tmp_path / "redis", port=port).start()
