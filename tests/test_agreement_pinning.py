"""``benchmarks/vllm_client_agreement.py --pin`` splits the CPUs this process may use between the
server and the clients (the split the slow real-vLLM comparison runs with)."""

from __future__ import annotations

import os

import pytest

from benchmarks import vllm_client_agreement as agreement


@pytest.mark.parametrize("allowed, server, clients", [({0, 1}, {0}, {1}), ({2, 5, 7}, {2, 5}, {7})])
def test_pin_gives_the_clients_the_last_allowed_cpu_and_the_server_the_rest(monkeypatch, allowed, server, clients):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(allowed))
    assert agreement.split_cpus() == (server, clients)


def test_pin_on_one_cpu_says_so(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    with pytest.raises(ValueError, match="needs 2 CPUs.*without --pin"):
        agreement.split_cpus()
