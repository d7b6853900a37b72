"""Agents as a rollout: the user's agent function runs each episode against an OpenAI-compatible
endpoint over the rollout engine, and the endpoint keeps the episode's token ids.

* :mod:`.server`: the HTTP endpoint (``/v1/chat/completions``, ``/v1/completions``) on
  127.0.0.1, a random port and a random bearer token per run; one base URL per episode.
* :mod:`.ledger`: an episode's samples, token by token (prompt ids, the sampled ids as they are,
  log-probs, weight versions), and the rule that maps a request onto them.
* :mod:`.engine_queue`: requests of all episodes batched into the engine calls of the rollout.
* :mod:`.rollout`: :class:`~.rollout.AgentRollout`, the rollout of ``algorithm.multi_turn.agent``.
* :mod:`.episode`: :class:`~.episode.AgentEpisode`, what the agent function receives.

Light at import time: fastapi, uvicorn, openai and torch are imported where they are used.
"""
