"""A rollout.ray_address where no Ray cluster answers is one error naming the key, at once: ray.init retried an
unreachable GCS for minutes, printing only its own connection warnings."""

from __future__ import annotations

import socket

import pytest

from fastrl.rollout.cluster import _check_reachable


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_nothing_listens_on_is_named():
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(ValueError, match=rf"rollout.ray_address={address}: no Ray cluster answers there"):
        _check_reachable(address, timeout_s=2.0)


def test_a_listening_address_and_rays_own_forms_pass():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        _check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=2.0)
    for address in ("auto", "ray://head:10001"):
        _check_reachable(address, timeout_s=0.01)  # Ray resolves these itself
