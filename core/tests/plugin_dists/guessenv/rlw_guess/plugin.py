"""A third-party environment (the model guesses the record's digit, hearing 'higher' or 'lower')
and a third-party tool-call parser (``name(key=value, ...)`` on a line of its own)."""
from pydantic import BaseModel, ConfigDict, Field
from rlweave.interfaces.environment import Environment, EnvStep
from rlweave.environments.parsers import ToolCall
from rlweave.plugins import EnvironmentRecord, ToolParserRecord, hookimpl


class GuessArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bonus: float = Field(1.0, description="Reward for the right digit.")


class Guess(Environment):
    def reset(self, record):
        self.secret = int(record["secret"])
        return [{"role": "user", "content": "guess a digit"}]

    def step(self, action):
        digits = [int(c) for c in action if c.isdigit()]
        if not digits:
            return EnvStep(messages=[{"role": "user", "content": "a digit, please"}])
        if digits[0] == self.secret:
            return EnvStep(done=True, reward=self.args.bonus)
        word = "higher" if digits[0] < self.secret else "lower"
        return EnvStep(messages=[{"role": "user", "content": word}], reward=-0.1)


@hookimpl
def rlweave_environments():
    return [EnvironmentRecord(name="guess", summary="guess a digit", target="rlw_guess.plugin:Guess",
                              config_model=GuessArgs)]


def calls(text):
    """``name(key=value, ...)`` lines; values are integers, else strings."""
    out, problems = [], []
    for line in text.splitlines():
        name, _, rest = line.strip().partition("(")
        if not rest.endswith(")") or not name.isidentifier():
            continue
        args = {}
        for pair in filter(None, (p.strip() for p in rest[:-1].split(","))):
            key, eq, value = pair.partition("=")
            if not eq:
                problems.append(f"argument {pair!r} of {name} is not key=value")
                break
            args[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
        else:
            out.append(ToolCall(name, args))
    return out, problems


@hookimpl
def rlweave_tool_parsers():
    return [ToolParserRecord(name="parens", summary="name(key=value) lines", target="rlw_guess.plugin:calls",
                             call_format="name(key=value, ...) on a line of its own")]
