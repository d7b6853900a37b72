"""The agent endpoint's cost: episodes/s of an agent driving the engine through the OpenAI-compatible
endpoint (``algorithm.multi_turn.agent``, the stock ``openai`` client) against the built-in ``tools``
environment, on the same task, model, engine and sampling.

The tools example's tiny model (``examples/tools/build_model.py``, random weights) generates on the
HF engine in this process, ``--episodes`` episodes of ``a*b=`` prompts, at most ``--turns`` model
turns of ``--new-tokens`` tokens. Both read every model turn as one calculator call (a parser that
does so: a random model writes no well-formed call), so both make the same number of turns: the
``tools`` environment runs ``rlweave.environments.calculator:calculate`` in its sandboxed workers,
the agent runs it in its own thread and sends the result back as a ``tool`` message. The two take
turns ``--repeat`` times; prints the median episodes/s of each and the ratio.

    python bench/agent_endpoint.py                       # 64 episodes, 3 turns of 16 tokens
    python bench/agent_endpoint.py --episodes 128 --repeat 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}]


def every_turn(text):
    """Each model turn is one calculator call."""
    from rlweave.environments.parsers import ToolCall

    return [ToolCall("calculator", {"expression": "686*72"})], []


def agent(episode):
    """The agent side: call, run the calculator on each tool call, send the result, until the turns end."""
    from rlweave.environments.calculator import calculate

    msgs = [{"role": "user", "content": episode.record["prompt"]}]
    for _ in range(episode.record["turns"]):
        reply = episode.client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS).choices[0].message
        msgs.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return None
        for call in reply.tool_calls:
            msgs.append({"role": "tool", "tool_call_id": call.id,
                         "content": str(calculate(**json.loads(call.function.arguments)))})
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    from rlweave.algo_helpers.agent.rollout import AgentRollout
    from rlweave.algo_helpers.multi_turn import MultiTurnRollout
    from rlweave.algo_helpers.multi_turn_config import MultiTurnConfig, resolve_environment
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.interfaces.worker import WorkerContext
    from rlweave_infer_hf.engine import HFEngine
    from transformers import AutoTokenizer

    spec = importlib.util.spec_from_file_location("tools_build", REPO / "examples/tools/build_model.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    model = str(build.build(Path(tempfile.mkdtemp()) / "m"))
    tok = AutoTokenizer.from_pretrained(model)
    engine = HFEngine(WorkerContext(role="rollout", options={"max_model_len": 256},
                                    model={"path": model, "dtype": "float32"}, seed=1))
    engine.init_engine()
    me = f"{Path(__file__).resolve()}"
    common = {"max_turns": args.turns, "max_total_tokens": 240, "end_on_length": False}  # the agent goes on too
    env_cfg = MultiTurnConfig.model_validate({"env": {"name": "tools", "args": {
        "tools": [{"name": "calculator", "target": "rlweave.environments.calculator:calculate"}],
        "parser": f"{me}:every_turn", "system_prompt": "", "max_tool_calls": args.turns}}, **common})
    agent_cfg = MultiTurnConfig.model_validate({"agent": {"target": f"{me}:agent", "parser": f"{me}:every_turn"},
                                                **common})
    env_cls, env_args = resolve_environment("tools", env_cfg.env.args)
    sys.modules.setdefault("agent_bench", sys.modules[__name__])
    rollouts = {"tools env": MultiTurnRollout(env_cfg, env_cls, env_args, tok),
                "agent endpoint": AgentRollout(agent_cfg, agent, tok)}
    records = [{"id": str(i), "prompt": f"{100 + 7 * i}*{10 + i % 90}=", "turns": args.turns}
               for i in range(args.episodes)]
    sampling = SamplingParams(max_new_tokens=args.new_tokens, stop_token_ids=[tok.eos_token_id], seed=1)
    rates: dict[str, list[float]] = {k: [] for k in rollouts}
    turns: dict[str, float] = {}
    try:
        for _ in range(args.repeat):
            for name, rollout in rollouts.items():
                t0 = time.perf_counter()
                groups = rollout.episodes(records, 1, sampling, engine.generate)
                rates[name].append(args.episodes / (time.perf_counter() - t0))
                turns[name] = statistics.mean(t.stats["turns"] for g in groups for t in g)
    finally:
        for rollout in rollouts.values():
            rollout.close()
        engine.shutdown()
    base = statistics.median(rates["tools env"])
    print(f"{args.episodes} episodes, at most {args.turns} turns of {args.new_tokens} tokens, HF engine, "
          f"tools example's tiny model; median of {args.repeat}")
    for name, r in rates.items():
        print(f"  {name:15s} {statistics.median(r):7.2f} episodes/s  {turns[name]:.2f} turns/episode  "
              f"{statistics.median(r) / base:.2f}x")


if __name__ == "__main__":
    main()
