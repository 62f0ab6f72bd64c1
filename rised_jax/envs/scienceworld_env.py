"""ScienceWorld (scienceworld 1.2.3, its bundled scienceworld.jar; needs Java) as an environment.

Difficulty: `task`, one ScienceWorld task name or several joined by commas (default
"find-living-thing"); `simplification`, ScienceWorld's simplification string ("easy" = its
teleport, open-doors, open-containers, no-electrical set; "" for none); `eval_split`, the split
that evaluation plays ("dev" or "test"); `held_out_from`, the first seed of the evaluation
range (keep it equal to `config.eval.seed_offset`, 1_000_000 by default); `max_turns`, when
given, a fixed budget; by default each instance gets max(50, 2 x its gold length) turns.

Seeds below `held_out_from` play the suite's TRAIN variations, seeds from it on the
`eval_split` variations: seed s picks `pairs[s % len(pairs)]` of the (task, variation) pairs of
that split. So training and evaluation are instance-disjoint by the suite's own split, and the
instance key (task, variation, simplification) keeps `tasks.TaskStream`'s exclusion exact even
when the offsets disagree. The oracle is ScienceWorld's gold action sequence; the score (0-100)
gives progress / regress events, completion is score 100, a score below 0 is a lost episode.
"""
from __future__ import annotations

from typing import Any, ClassVar, Hashable

from rised_jax.envs import suites, text_suite

scienceworld = suites.require("scienceworld", "scienceworld", "scienceworld")

SPLITS = ("train", "dev", "test")
DEFAULT_TASK = "find-living-thing"
_REJECTED = "No known action matches that input."
_STEP_LIMIT = 100_000   # the turn budget is max_turns; the suite's own limit never binds
_ACTIONS_HELP = (
    "look around, look at OBJ, look in OBJ, inventory, task, go to LOCATION, open OBJ, close "
    "OBJ, pick up OBJ, put down OBJ, move OBJ to OBJ, pour OBJ into OBJ, mix OBJ, activate OBJ, "
    "deactivate OBJ, use OBJ on OBJ, heat OBJ, read OBJ, eat OBJ, focus on OBJ (commits to an "
    "object; focusing on the wrong one loses the task), wait, wait1, connect OBJ to OBJ")


class ScienceWorld(text_suite.TextSuite):
  """A ScienceWorld task variation; actions are ScienceWorld's own commands."""

  name = "scienceworld"
  default_max_turns = 50
  # Gold runs reach 176 commands (boil); twice the gold length leaves an agent as many turns
  # for looking and mistakes as the scripted run needs, and never less than 50.
  gold_turns_factor = 2
  max_score = 100.0
  pool_key = "scienceworld"
  _splits: ClassVar[dict[tuple[str, str], dict[str, list[int]]]] = {}

  def __init__(self, *, task: str = DEFAULT_TASK, simplification: str = "easy",
               eval_split: str = "dev", held_out_from: int = 1_000_000,
               max_turns: int | None = None, shaping: float = 0.0):
    super().__init__(eval_split=eval_split, held_out_from=held_out_from, max_turns=max_turns,
                     shaping=shaping)
    known = _task_names()
    if not isinstance(task, str) or not task.strip():
      raise ValueError(f"scienceworld: task must be a task name (or several joined by commas), "
                       f"got {task!r}; tasks: {known}")
    self.tasks = [t.strip() for t in task.split(",")]
    unknown = [t for t in self.tasks if t not in known]
    if unknown:
      raise ValueError(f"scienceworld: unknown task(s) {unknown}; ScienceWorld has {known}")
    if not isinstance(simplification, str):
      raise ValueError(f"scienceworld: simplification must be a string such as 'easy', got "
                       f"{simplification!r}")
    self.simplification = simplification

  @property
  def system_prompt(self) -> str:
    return (
        "You are an agent in ScienceWorld, a text simulation of a house with a kitchen, a "
        "greenhouse, a workshop and more, where you do elementary science tasks. Each turn give "
        f"one command, such as: {_ACTIONS_HELP}. The observation shows the result and your "
        f"score (100 means the task is complete). {self.ANSWER_FORMAT} "
        "Example: <answer>go to kitchen</answer>")

  def action_space(self) -> list[str]:
    return ["look around", "inventory", "task", "wait"]

  def _choose(self, seed: int) -> Hashable:
    split = "train" if seed < self.held_out_from else self.eval_split
    pairs = [(t, v) for t in self.tasks for v in self._variations(t)[split]]
    task, variation = pairs[seed % len(pairs)]
    return (task, int(variation), self.simplification)

  def _variations(self, task: str) -> dict[str, list[int]]:
    key = (task, self.simplification)
    if key not in ScienceWorld._splits:
      def read(backend: Any) -> dict[str, list[int]]:
        backend.load(task, 0, self.simplification, generateGoldPath=False)
        return dict(train=list(backend.get_variations_train()),
                    dev=list(backend.get_variations_dev()),
                    test=list(backend.get_variations_test()))

      ScienceWorld._splits[key] = self._pool().use(read)
    return ScienceWorld._splits[key]

  def _new_backend(self) -> Any:
    return scienceworld.ScienceWorldEnv("", envStepLimit=_STEP_LIMIT)

  def _load(self, backend: Any, instance: Hashable
            ) -> tuple[str, Hashable, float, tuple[str, ...]]:
    task, variation, simplification = instance
    backend.load(task, variation, simplification, generateGoldPath=True)
    look, inventory = backend.look(), backend.inventory()
    intro = f"Task: {backend.get_task_description()}\n{look.strip()}"
    return intro, (look, inventory), 0.0, ()   # its commands are lower case already

  def _gold(self, backend: Any) -> list[str]:
    return list(backend.get_gold_action_sequence())

  def _send(self, backend: Any, command: str) -> text_suite.Report:
    observation, _, _, info = backend.step(command)
    score = float(info["score"])
    return text_suite.Report(
        feedback=observation, score=score, view=(info["look"], info["inv"]),
        rejected=observation.strip().startswith(_REJECTED), success=score >= self.max_score,
        failed=score < 0)


def _task_names() -> list[str]:
  """ScienceWorld's task names, read from the package (no JVM)."""
  from scienceworld.constants import ID2TASK  # pylint: disable=import-outside-toplevel
  return sorted(ID2TASK.values())
