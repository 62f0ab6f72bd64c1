"""TextWorld Express (textworld-express 1.1.0, its bundled jar; needs Java) games.

Three games, one environment name each: `twx_coin` (CoinCollector: find the coin and take it),
`twx_cooking` (CookingWorld: read the cookbook, gather, prepare and eat the meal) and `twx_twc`
(TextWorld Commonsense: put objects where they belong). TreasureHunter is a TextWorld (proper)
challenge, not a TextWorld Express game, so it is not here.

Difficulty: `params`, TextWorld Express's game parameter string (e.g. "numLocations=5,
includeDoors=1,numDistractorItems=0"; "" for the game's defaults); `eval_split` ("dev" or
"test") and `held_out_from` as in `scienceworld_env`: seeds below `held_out_from` play the
game's train seeds (`train[s % len]`), seeds from it on the `eval_split` seeds, so training and
evaluation never share a game. The oracle is the game's gold action sequence; the score (0-1)
gives progress / regress events, `tasksuccess` is success and `taskfailure` a lost episode.
"""
from __future__ import annotations

from typing import Any, ClassVar, Hashable

from rised_jax.envs import suites, text_suite

textworld_express = suites.require("textworld_express", "twx", "twx_*")

_REJECTED = "Unknown action"
_STEP_LIMIT = 100_000   # the turn budget is max_turns; the suite's own limit never binds


class TextWorldExpress(text_suite.TextSuite):
  """One TextWorld Express game; `game` is the suite's game name."""

  game: ClassVar[str]
  description: ClassVar[str]
  max_score = 1.0
  pool_key = "textworld_express"   # the three games share their JVMs
  _seeds: ClassVar[dict[tuple[str, str], dict[str, list[int]]]] = {}

  def __init__(self, *, params: str = "", eval_split: str = "dev", held_out_from: int = 1_000_000,
               max_turns: int | None = None, shaping: float = 0.0):
    super().__init__(eval_split=eval_split, held_out_from=held_out_from, max_turns=max_turns,
                     shaping=shaping)
    if not isinstance(params, str):
      raise ValueError(f"{self.name}: params must be a TextWorld Express parameter string such "
                       f"as 'numLocations=5,includeDoors=1', got {params!r}")
    self.params = params

  @property
  def system_prompt(self) -> str:
    return (
        f"You are playing a TextWorld Express text game ({self.description}). Each turn give "
        "one command such as: look around, inventory, move north (south, east, west), open "
        "door to north, take OBJ, put OBJ in CONTAINER, open OBJ, read OBJ, slice / dice / "
        f"chop OBJ, cook OBJ in APPLIANCE, prepare meal, eat meal. {self.ANSWER_FORMAT} "
        "Example: <answer>move east</answer>")

  def action_space(self) -> list[str]:
    return ["look around", "inventory", "move north", "move south", "move east", "move west"]

  def _choose(self, seed: int) -> Hashable:
    fold = "train" if seed < self.held_out_from else self.eval_split
    seeds = self._fold_seeds()[fold]
    return (self.game, self.params, fold, int(seeds[seed % len(seeds)]))

  def _fold_seeds(self) -> dict[str, list[int]]:
    key = (self.game, self.params)
    if key not in TextWorldExpress._seeds:
      def read(backend: Any) -> dict[str, list[int]]:
        backend.load(self.game, self.params)
        return dict(train=list(backend.getValidSeedsTrain()),
                    dev=list(backend.getValidSeedsDev()), test=list(backend.getValidSeedsTest()))

      TextWorldExpress._seeds[key] = self._pool().use(read)
    return TextWorldExpress._seeds[key]

  def _new_backend(self) -> Any:
    return textworld_express.TextWorldExpressEnv(envStepLimit=_STEP_LIMIT)

  def _load(self, backend: Any, instance: Hashable
            ) -> tuple[str, Hashable, float, tuple[str, ...]]:
    game, params, fold, seed = instance
    backend.load(game, params)
    observation, info = backend.reset(seed=seed, gameFold=fold, generateGoldPath=True)
    intro = f"Task: {info['taskDescription']}\n{observation.strip()}"
    return (intro, (info["look"], info["inventory"]), float(info["score"]),
            tuple(info["validActions"]))

  def _gold(self, backend: Any) -> list[str]:
    return list(backend.getGoldActionSequence())

  def _send(self, backend: Any, command: str) -> text_suite.Report:
    observation, _, _, info = backend.step(command)
    return text_suite.Report(
        feedback=observation, score=float(info["score"]), view=(info["look"], info["inventory"]),
        rejected=observation.strip().startswith(_REJECTED), success=bool(info["tasksuccess"]),
        failed=bool(info["taskfailure"]), admissible=tuple(info["validActions"]))


class CoinCollector(TextWorldExpress):
  name = "twx_coin"
  game = "coin"
  description = "CoinCollector: find the coin somewhere in the house and take it"
  default_max_turns = 40


class CookingWorld(TextWorldExpress):
  name = "twx_cooking"
  game = "cookingworld"
  description = ("CookingWorld: find and read the cookbook, gather the ingredients, prepare "
                 "them as the recipe says, then prepare and eat the meal")
  default_max_turns = 128   # gold sequences of the default (11-room) games reach 101 commands


class Commonsense(TextWorldExpress):
  name = "twx_twc"
  game = "twc"
  description = ("TextWorld Commonsense: pick up the objects that are out of place and put "
                 "each where it belongs")
  default_max_turns = 50
