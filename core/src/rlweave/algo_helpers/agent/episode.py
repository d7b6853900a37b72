"""What an agent function receives: :class:`AgentEpisode`.

An agent is a plain function, ``def agent(episode) -> float | None`` or ``async def``, named in
``algorithm.multi_turn.agent``; it is called once per episode, in a thread of the controller's
process, and talks to the policy only through ``episode.client`` (``openai.OpenAI``) or
``episode.async_client`` (``openai.AsyncOpenAI``), already pointed at the episode's base URL with
the run's token. Any ``model`` name works. It returns the episode's reward, or None to let the
run's ``rewards`` score the episode's final answer (the last model turn it was given).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


@dataclass
class AgentEpisode:
    """One episode: its data ``record``, ``base_url`` and ``api_key`` (for clients of your own),
    ``model`` (the name to send), ``episode_id``, and the OpenAI clients (no retries; each request
    waits at most ``request_timeout_s``, None: as long as the engine takes, which is not the
    episode's own time: ``agent.timeout_s`` does not count it, see :mod:`.clock`)."""

    record: dict[str, Any]
    base_url: str
    api_key: str
    episode_id: str
    model: str = "policy"
    request_timeout_s: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def client(self) -> Any:
        """An ``openai.OpenAI`` client of this episode."""
        from rlweave.deps import require

        openai = require("openai", "rlweave[agent]")
        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0,
                             timeout=self.request_timeout_s)

    @cached_property
    def async_client(self) -> Any:
        """An ``openai.AsyncOpenAI`` client of this episode (use it inside ``async def`` agents)."""
        from rlweave.deps import require

        openai = require("openai", "rlweave[agent]")
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0,
                                  timeout=self.request_timeout_s)
