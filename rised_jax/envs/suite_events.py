"""Rule-judge events of the real environment suites, from each suite's own signals.

The rule-based judge (`rised_jax.rubrics.rule_judge`) reads only `rised_jax.types.Event`
values; the built-in games emit them from their own models. The suite adapters
(`rised_jax.envs.babyai`, `scienceworld_env`, `twx`) emit them from what the suite itself
reports, by the one mapping below, so every tag of the shared vocabulary means the same thing
on every environment:

| suite signal                                                   | event                | tags it feeds |
| -------------------------------------------------------------- | -------------------- | ------------- |
| the suite's parser refused the command (ScienceWorld "No known action matches that input.", TextWorld Express "Unknown action"; BabyAI: not one of its 6 actions) | invalid_action | malformed_action, not valid_syntax |
| the distance to the goal fell: ScienceWorld / TWX score rose; BabyAI: the BabyAI bot's plan from the new state is shorter | progress | makes_progress, recovers_from_mistakes |
| the distance rose (score fell; the bot's plan grew)            | regress              | loses_ground |
| an accepted, non-informational command changed nothing (same view, inventory and score; BabyAI: same grid, pose and carried object) | no_effect | not efficient, repeats_ineffective_action |
| the suite ended the episode lost (ScienceWorld score < 0, TWX `taskfailure`, BabyAI mission verified "failure") | irreversible_failure | irreversible_losing_step |
| the suite reports completion (score 100, `tasksuccess`, BabyAI reward > 0) | success (added by `base.Environment`) | none: rules never read the outcome |

`repeated_action` and `gave_up` come from `base.Environment` as for the built-in games.
"""
from __future__ import annotations

from rised_jax.types import Event


def step_events(*, rejected: bool, changed: bool, informational: bool = False,
                distance_before: float | None = None, distance_after: float | None = None,
                failed: bool = False) -> list[str]:
  """The events of one suite step (see the module table).

  rejected: the suite refused the command (then nothing else is reported);
  changed: the state the agent sees changed; informational: a command meant to look, not to act
  (look, inventory, examine, read), which is never `no_effect`;
  distance_*: the distance to the goal before and after (None where unknown);
  failed: the suite ended the episode as lost.
  """
  if rejected:
    return [Event.INVALID_ACTION.value]
  events = []
  if distance_before is not None and distance_after is not None:
    if distance_after < distance_before:
      events.append(Event.PROGRESS.value)
    elif distance_after > distance_before:
      events.append(Event.REGRESS.value)
  if not changed and not informational and not events:
    events.append(Event.NO_EFFECT.value)
  if failed:
    events.append(Event.IRREVERSIBLE_FAILURE.value)
  return events
