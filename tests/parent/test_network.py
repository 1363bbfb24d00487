"""Every network probe (the W&B server, the Hugging Face Hub, doctor's rendezvous endpoint) goes
through one helper (``preflight/network.py``) that answers within its bound even when the name
lookup hangs: ``socket.create_connection``'s timeout does not cover ``getaddrinfo``. The resolver
here is stalled by hand; each probe must give its answer while that lookup is still stuck."""

from __future__ import annotations

import socket
import threading

import pytest

from qwen3_trainium.parent import doctor
from qwen3_trainium.parent.preflight import data, host, network

BOUND_S = 0.2


class StalledResolver:
    """``getaddrinfo`` that answers nothing until released (at the test's end)."""

    def __init__(self) -> None:
        self.entered, self.finished, self.release = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):
        self.entered.set()
        try:
            self.release.wait(120)  # the old probes waited here; they would then fail the test
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        finally:
            self.finished.set()


@pytest.fixture
def stalled(monkeypatch):
    resolver = StalledResolver()
    monkeypatch.setattr(socket, "getaddrinfo", resolver)  # what create_connection looks names up with
    monkeypatch.setattr(network, "TIMEOUT_S", BOUND_S)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # conftest switches the Hub off
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    yield resolver
    resolver.release.set()


def _answered_while_stalled(resolver: StalledResolver) -> bool:
    return resolver.entered.is_set() and not resolver.finished.is_set()


def test_the_probe_answers_within_its_bound_while_the_name_lookup_hangs(stalled):
    why = network.connect_error("head.invalid", 29500)
    assert why == f"head.invalid:29500: no answer within {BOUND_S:g} s"
    assert _answered_while_stalled(stalled)


def test_the_hub_probe_is_the_bounded_one(stalled):
    assert data.hub_offline() is True
    assert _answered_while_stalled(stalled)


def test_doctors_rendezvous_probe_is_the_bounded_one(stalled):
    ok, text = doctor._endpoint_ok("head.invalid:29500")
    assert (
        not ok
        and text == f"head.invalid:29500 not reachable: head.invalid:29500: no answer within {BOUND_S:g} s"
    )
    assert _answered_while_stalled(stalled)


def test_the_wandb_probe_is_the_bounded_one(stalled):
    assert host.reachable("https://wandb.invalid") == f"wandb.invalid:443: no answer within {BOUND_S:g} s"
    assert _answered_while_stalled(stalled)


def test_a_refused_connection_is_named_with_its_host_and_port():
    """Nothing listens on port 9 of this host (discard): the answer is the kernel's refusal."""
    why = network.reachable("http://127.0.0.1:9")
    assert why is not None and why.startswith("127.0.0.1:9: ") and "no answer" not in why


@pytest.mark.parametrize(
    ("endpoint", "words"),
    [("foo:http", "port 'http' is not a number"), ("foo:70000", "port '70000'"), ("a b:1", "host 'a b'")],
)
def test_doctor_names_an_endpoint_torchrun_would_not_read_instead_of_raising(endpoint, words):
    ok, text = doctor._endpoint_ok(endpoint)
    assert not ok and text.startswith(f"{endpoint} is no rendezvous endpoint: its ") and words in text


@pytest.mark.parametrize(
    ("endpoint", "parsed"),
    [
        ("localhost:0", ("localhost", 0)),
        ("trn2-01:29500", ("trn2-01", 29500)),
        ("[::1]:5", ("::1", 5)),
        ("head", ("head", 29400)),
        ("[fe80::1]", ("fe80::1", 29400)),
    ],
)
def test_endpoints_parse_as_torchrun_parses_them(endpoint, parsed):
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    from qwen3_trainium.config import nodes

    assert nodes.parse_endpoint(endpoint) == parsed == parse_rendezvous_endpoint(endpoint, default_port=29400)
