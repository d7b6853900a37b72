"""The OpenAI-compatible endpoint of an agent rollout: one HTTP server per rollout, in the
controller's process (where the rollout runs), on 127.0.0.1 only, on a random free port, answering
only requests that carry its random bearer token (``Authorization: Bearer <token>``; else 401).

Routes (``<eid>``: the episode's id; its base URL is ``http://127.0.0.1:<port>/episodes/<eid>/v1``;
``/v1/...`` with an ``X-Episode-Id`` header works too):

* ``POST .../chat/completions`` and ``POST .../completions``: the request (checked by
  :mod:`.openai_api`) is mapped onto the episode's samples (:mod:`.ledger`), the engine continues
  the sample's ids (:mod:`.engine_queue`), and the reply is written from the sampled ids: text
  decoded without special tokens, cut after the first ``stop`` string (the ids kept up to the
  token that completed it), tool calls read by the run's parser when the request lists ``tools``.
* ``GET .../models``: the one model (any ``model`` name is accepted).

Errors are OpenAI-style JSON (``{"error": {"message", "type", "param", "code"}}``): 400 for a
malformed or unsupported request, 401 without the token, 404 for an unknown episode or route, 409
for an episode that has ended, 500 when the engine failed. Needs fastapi and uvicorn
(``pip install 'rlweave[agent]'``).
"""

import asyncio
import dataclasses
import hmac
import json
import secrets
import socket
import threading
from typing import Any

from rlweave.algo_helpers.agent import messages as msgs
from rlweave.algo_helpers.agent.errors import RequestError
from rlweave.algo_helpers.agent.ledger import Ledger, Sample
from rlweave.algo_helpers.agent.openai_api import (Request, chat_response, completion_response, parse_chat,
                                                   parse_completion)
from rlweave.interfaces.engine import Generation, SamplingParams

HOST = "127.0.0.1"


class Endpoint:
    """The server and the episodes it serves. ``tokenizer`` renders and decodes, ``parse`` reads
    tool calls, ``model`` is the name ``/models`` lists. :meth:`start` once; per rollout run
    :meth:`serve` binds the engine (an :class:`~.engine_queue.EngineQueue`), the run's default
    ``sampling`` and weight ``version``; :meth:`open` / :meth:`close_episode` an episode;
    :meth:`stop` at the end."""

    def __init__(self, tokenizer: Any, parse: Any, model: str = "policy"):
        self.tok, self.parse, self.model = tokenizer, parse, model
        self.token = secrets.token_urlsafe(32)
        self.episodes: dict[str, Ledger] = {}
        self.engine: Any = None
        self.sampling = SamplingParams()
        self.version = 0
        self.port = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Bind 127.0.0.1 on a free port and serve in a thread of this process."""
        from rlweave.deps import require

        uvicorn = require("uvicorn", "rlweave[agent]")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(build_app(self), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
                                        name="rlweave-agent-endpoint", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the agent endpoint failed to start")
            threading.Event().wait(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._server = None

    def base_url(self, eid: str) -> str:
        return f"http://{HOST}:{self.port}/episodes/{eid}/v1"

    def serve(self, engine: Any, sampling: SamplingParams, version: int) -> None:
        """Answer with ``engine`` from now on (None: 503); ``None`` also forgets the episodes
        (their later requests get 404)."""
        self.engine, self.sampling, self.version = engine, sampling, version
        if engine is None:
            self.episodes.clear()

    def open(self, ledger: Ledger) -> None:
        self.episodes[ledger.eid] = ledger

    def close_episode(self, eid: str, why: str) -> Ledger:
        """End episode ``eid``: its later requests get 409, a turn under way is not added."""
        ledger = self.episodes[eid]
        with ledger.lock:
            ledger.closed = why
        return ledger

    # ------------------------------------------------------------------ requests
    def ledger(self, eid: str | None) -> Ledger:
        if not eid:
            raise RequestError(404, "no episode: use the episode's base URL (/episodes/<id>/v1) or an X-Episode-Id "
                               "header", code="episode_not_found")
        found = self.episodes.get(eid)
        if found is None:
            raise RequestError(404, f"episode '{eid}' is not running", code="episode_not_found")
        return found

    async def chat(self, eid: str | None, body: Any) -> dict[str, Any]:
        req = parse_chat(body)
        ledger = self.ledger(eid)
        with ledger.lock:
            ledger.admit()
            sample = ledger.chat_sample(req.messages or [], req.tools)
        gens, texts = await self._generate(ledger, sample, req)
        parse = self.parse if req.parse_tools else None
        call = f"call_{secrets.token_hex(6)}"
        replies = [msgs.reply(t, parse, f"{call}_{i}") for i, t in enumerate(texts)]
        self._keep(ledger, sample, gens, replies)
        return chat_response(req, replies, gens, self._tokens(req, gens), len(sample.context) - len(gens[0].token_ids))

    async def completion(self, eid: str | None, body: Any) -> dict[str, Any]:
        req = parse_completion(body)
        ledger = self.ledger(eid)
        with ledger.lock:
            ledger.admit()
            sample = ledger.completion_sample(req.prompt or "")
        gens, texts = await self._generate(ledger, sample, req)
        self._keep(ledger, sample, gens, texts)
        return completion_response(req, texts, gens, self._tokens(req, gens),
                                   len(sample.context) - len(gens[0].token_ids))

    async def _generate(self, ledger: Ledger, sample: Sample, req: Request) -> tuple[list[Generation], list[str]]:
        """The engine's choices for ``sample`` (cut at ``stop`` strings) and their texts."""
        try:
            if self.engine is None:
                raise RequestError(503, "the rollout is not generating now", code="not_generating")
            base = self.sampling
            params = dataclasses.replace(
                base, n=req.n, temperature=base.temperature if req.temperature is None else float(req.temperature),
                top_p=base.top_p if req.top_p is None else float(req.top_p), seed=req.seed, token_budget=None,
                max_new_tokens=max(1, min(req.max_tokens or base.max_new_tokens, ledger.room(sample))))
            with ledger.clock.engine_wait():  # not the agent's own time (agent.timeout_s)
                gens = await asyncio.wrap_future(self.engine.submit(sample.context, params))
            bad = next((g for g in gens if g.finish_reason == "error"), None)
            if bad is not None:
                raise RequestError(500, f"the engine failed: {bad.error}", code="engine_error")
        except BaseException as exc:
            with ledger.lock:
                ledger.release(sample)
            if isinstance(exc, Exception) and not isinstance(exc, RequestError):
                raise RequestError(500, f"the engine failed: {type(exc).__name__}: {exc}", code="engine_error") from exc
            raise
        out = [self._cut(g, req.stop) for g in gens]
        return [g for g, _ in out], [t for _, t in out]

    def _cut(self, gen: Generation, stops: list[str]) -> tuple[Generation, str]:
        """``gen`` up to the token that completes the first ``stop`` string, and its text before it."""
        decode = lambda ids: self.tok.decode(ids, skip_special_tokens=True)  # noqa: E731
        text = decode(gen.token_ids)
        if not stops or not any(s in text for s in stops):
            return gen, text
        for j in range(1, len(gen.token_ids) + 1):
            part = decode(gen.token_ids[:j])
            hits = [part.index(s) for s in stops if s in part]
            if hits:
                cut = dataclasses.replace(gen, token_ids=list(gen.token_ids[:j]), logprobs=list(gen.logprobs[:j]),
                                          versions=list(gen.versions[:j]), finish_reason="stop")
                return cut, part[:min(hits)]
        return gen, text

    def _keep(self, ledger: Ledger, sample: Sample, gens: list[Generation], replies: list[Any]) -> None:
        with ledger.lock:
            if ledger.closed is not None:
                raise RequestError(409, f"episode '{ledger.eid}' has ended ({ledger.closed})", code="episode_ended")
            ledger.add_choices(sample, gens, self.version, replies)

    def _tokens(self, req: Request, gens: list[Generation]) -> list[list[str]]:
        if not req.logprobs:
            return [[] for _ in gens]
        return [[self.tok.decode([t]) for t in g.token_ids] for g in gens]


def build_app(endpoint: Endpoint) -> Any:
    """The FastAPI application of ``endpoint`` (see the module docstring)."""
    from rlweave.deps import require

    require("fastapi", "rlweave[agent]")
    from fastapi import FastAPI, Request as HTTPRequest
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    def error(exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.middleware("http")
    async def authorize(request: HTTPRequest, call_next: Any) -> Any:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {endpoint.token}".encode()):
            return error(RequestError(401, "Incorrect API key provided: this endpoint takes the run's token as a "
                                      "bearer token", kind="authentication_error", code="invalid_api_key"))
        return await call_next(request)

    @app.exception_handler(HTTPException)
    async def http_error(request: HTTPRequest, exc: HTTPException) -> Any:
        return error(RequestError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                  code="not_found" if exc.status_code == 404 else None))

    async def body_of(request: HTTPRequest) -> Any:
        try:
            return json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
        except ClientDisconnect:  # an agent cancelled while sending (its episode ended): nobody reads the answer
            raise RequestError(400, "the client disconnected before its request was read",
                               code="client_disconnected") from None

    async def answer(request: HTTPRequest, eid: str | None, kind: str) -> Any:
        eid = eid or request.headers.get("x-episode-id")
        try:
            body = await body_of(request)
            out = await (endpoint.chat(eid, body) if kind == "chat" else endpoint.completion(eid, body))
        except RequestError as exc:
            return error(exc)
        return JSONResponse(out)

    for prefix in ("/episodes/{eid}/v1", "/v1"):
        app.add_api_route(f"{prefix}/chat/completions", _route(answer, "chat"), methods=["POST"])
        app.add_api_route(f"{prefix}/completions", _route(answer, "completion"), methods=["POST"])
        app.add_api_route(f"{prefix}/models", lambda: {"object": "list", "data": [
            {"id": endpoint.model, "object": "model", "created": 0, "owned_by": "rlweave"}]}, methods=["GET"])
    return app


def _route(answer: Any, kind: str) -> Any:
    from fastapi import Request as HTTPRequest

    async def route(request: HTTPRequest, eid: str | None = None) -> Any:
        return await answer(request, eid, kind)

    return route
