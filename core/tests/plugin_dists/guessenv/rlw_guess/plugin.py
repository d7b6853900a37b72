"""A third-party environment: the model guesses the record's digit, hearing 'higher' or 'lower'."""
from pydantic import BaseModel, ConfigDict, Field
from rlweave.interfaces.environment import Environment, EnvStep
from rlweave.plugins import EnvironmentRecord, hookimpl


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
