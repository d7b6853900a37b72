"""The agent endpoint's refusals (fast: a scripted generate stands in for the engine; the engine
path is ``test_agent_endpoint.py``): OpenAI-style 4xx errors with a message for malformed
requests, 401 without the run's token, 404/409 for episodes not running, and a server that
listens on the loopback interface only."""

from __future__ import annotations

import socket

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def served():
    from rlweave.algo_helpers.agent.engine_queue import EngineQueue
    from rlweave.algo_helpers.agent.ledger import Ledger
    from rlweave.algo_helpers.agent.server import Endpoint
    from rlweave.environments.parsers import hermes
    from rlweave.interfaces.engine import Generation, SamplingParams
    from rlweave.testing.tiny_tokenizer import char_tokenizer

    tok = char_tokenizer(["0123456789+-= abc"])

    def generate(prompts, params):
        ids = tok("12 ab", add_special_tokens=False)["input_ids"][:params.max_new_tokens]
        return [[Generation(list(ids), [-0.1] * len(ids), "length") for _ in range(params.n)] for _ in prompts]

    ep = Endpoint(tok, hermes)
    ep.start()
    engine = EngineQueue(generate, lambda: 1, seed=0)
    ep.serve(engine, SamplingParams(max_new_tokens=8), 0)
    for eid in ("e1", "e2", "short"):
        ep.open(Ledger(eid, {"prompt": "1"}, tok, max_requests=50, max_total_tokens=12 if eid == "short" else 100))
    ep.close_episode("e2", "finished")
    yield ep
    engine.close()
    ep.stop()


def _post(ep, path, body=None, token=True, raw=None):
    headers = {"Authorization": f"Bearer {ep.token}"} if token else {}
    url = f"http://127.0.0.1:{ep.port}{path}"
    return httpx.post(url, headers=headers, json=body, content=raw, timeout=10)


CHAT = "/episodes/e1/v1/chat/completions"
GOOD = {"model": "m", "messages": [{"role": "user", "content": "1+1="}]}


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "tool", "content": "4"}]}, "messages[0].tool_call_id"),
    ({**GOOD, "temperature": 5}, "temperature"),
    ({**GOOD, "n": 0}, "n"),
    ({**GOOD, "max_tokens": "many"}, "max_tokens"),
    ({**GOOD, "stop": [1]}, "stop"),
    ({**GOOD, "stream": True}, "stream"),
    ({**GOOD, "top_logprobs": 3}, "top_logprobs"),
    ({**GOOD, "presence_penalty": 0.5}, "presence_penalty"),
    ({**GOOD, "tools": [{"type": "retrieval"}]}, "tools"),
    ({**GOOD, "tool_choice": "auto"}, "tool_choice"),
    ({**GOOD, "frobnicate": 1}, "frobnicate"),
])
def test_malformed_chat_requests_get_a_400_naming_the_field(served, body, param):
    r = _post(served, CHAT, body)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error"
    assert len(err["message"]) > 10


def test_malformed_completions_and_bodies(served):
    path = "/episodes/e1/v1/completions"
    for body, param in (({"model": "m"}, "prompt"), ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
                        ({"model": "m", "prompt": "1", "echo": True}, "echo")):
        r = _post(served, path, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
    r = _post(served, CHAT, raw=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = _post(served, CHAT, raw=b"[1, 2]")
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


def test_the_stock_client_sees_openai_errors(served):
    client = openai.OpenAI(base_url=served.base_url("e1"), api_key=served.token, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="m", messages=GOOD["messages"], temperature=7)
    ok = client.chat.completions.create(model="m", messages=GOOD["messages"], max_tokens=2, n=2, logprobs=True)
    assert [c.message.content for c in ok.choices] == ["12", "12"]
    assert [t.logprob for t in ok.choices[0].logprobs.content] == pytest.approx([-0.1, -0.1])
    cut = client.completions.create(model="m", prompt="1", max_tokens=5, stop=" a")
    assert cut.choices[0].text == "12" and cut.choices[0].finish_reason == "stop"
    wrong = openai.OpenAI(base_url=served.base_url("e1"), api_key="sk-not-the-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="API key"):
        wrong.chat.completions.create(model="m", messages=GOOD["messages"])


def test_requests_without_the_runs_token_are_refused(served):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": served.token}):
        r = httpx.post(f"http://127.0.0.1:{served.port}{CHAT}", headers=headers, json=GOOD, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(f"http://127.0.0.1:{served.port}/v1/models", timeout=10)
    assert r.status_code == 401


def test_episodes_not_running_and_limits(served):
    r = _post(served, "/episodes/nope/v1/chat/completions", GOOD)
    assert r.status_code == 404 and "not running" in r.json()["error"]["message"]
    r = _post(served, "/v1/chat/completions", GOOD)
    assert r.status_code == 404 and "X-Episode-Id" in r.json()["error"]["message"]
    r = _post(served, "/episodes/e2/v1/chat/completions", GOOD)
    assert r.status_code == 409 and r.json()["error"]["code"] == "episode_ended"
    r = _post(served, "/episodes/e1/v1/embeddings", GOOD)
    assert r.status_code == 404 and "error" in r.json()
    r = _post(served, "/episodes/short/v1/chat/completions", {**GOOD, "messages": [
        {"role": "user", "content": "1+1=1+1=1+1=1+1="}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def _other_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing interface
            addr = s.getsockname()[0]
    except OSError:
        addr = None
    if addr and not addr.startswith("127."):
        return addr
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def test_the_server_listens_on_loopback_only(served):
    sockets = served._server.servers[0].sockets
    assert {s.getsockname()[0] for s in sockets} == {"127.0.0.1"}
    other = _other_address()
    if other is None:
        pytest.skip("this machine has no address besides loopback")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        assert s.connect_ex((other, served.port)) != 0
