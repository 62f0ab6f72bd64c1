"""The mechanism suite's game (rised_jax.envs.doors): what wins, what each move reports to the
rule judge, which tags its vocabulary then sets, and the best constant policy."""
import collections

import pytest

from rised_jax import envs
from rised_jax.envs import doors
from rised_jax.rubrics import Vocabulary
from rised_jax.rubrics.rule_judge import RuleBasedJudge
from rised_jax.types import Task, Trajectory, Turn


def play(env, seed, reply):
  env.reset(seed)
  return env.step(reply)


def test_only_the_named_door_wins_and_every_move_reports_its_door():
  env = doors.Doors(doors=4, trap=True)
  for seed in range(40):
    observation = env.reset(seed)
    named = observation.split()[-2]       # "... behind the SIZE SHAPE DOOR door."
    assert named in doors.DOORS[:4]
    for door in env.action_space():
      _, reward, done, info = play(env, seed, f"<answer>{door}</answer>")
      assert done and info["success"] == (door == named) and reward == float(door == named)
      won = [doors.NAMED] if door == named else []
      assert info["events"] == [f"opens_with_{door}", *won] and not info["invalid"]
  _, reward, _, info = play(env, 0, "<answer>purple</answer>")   # not a door of this game
  assert reward == 0.0 and info["invalid"] and info["events"] == []
  assert doors.TRAP in env.system_prompt and "<answer>black</answer>" in env.system_prompt


def test_the_trap_never_wins_and_instances_differ_in_what_the_agent_sees():
  env = doors.Doors(doors=8)
  keys, observations = set(), set()
  for seed in range(2000):
    observations.add(env.reset(seed))
    keys.add(env.instance_key())
  assert len(keys) == len(observations) == 8 * 4 * 4
  trap = doors.Doors(doors=4, trap=True)
  assert {doors.winning_door(trap, s) for s in range(500)} == set(doors.DOORS[:4])


def test_vocabulary_tags_the_rule_on_a_win_and_the_trap_as_negative():
  """The won rollout carries the general rule ("Opens the door the note names"), whatever its
  door; the trap's rollout its negative tag; any other lost one only the syntax tag."""
  vocab = Vocabulary.load("rised_jax.envs.doors:VOCABULARY")
  judge = RuleBasedJudge(vocab)
  env = doors.Doors(doors=4, trap=True)
  for seed in (3, 4, 5, 6):
    winner = doors.winning_door(env, seed)
    for door in env.action_space():
      _, reward, done, info = play(env, seed, f"<answer>{door}</answer>")
      traj = Trajectory(Task("trapdoors", seed), [], [], [], 0,
                        [Turn(door, "", reward, done, info["invalid"], info["events"])],
                        success=info["success"], reward=reward)
      expected = {winner: ["valid_syntax", "event.opens_named_door"],
                  doors.TRAP: ["valid_syntax", "event.opens_with_black"]}.get(door,
                                                                              ["valid_syntax"])
      assert vocab.ids_of(judge.verdict(traj).tags) == expected
  assert vocab.entry("event.opens_named_door").description == "Opens the door the note names"
  assert vocab.entry("event.opens_named_door").positive
  assert not vocab.entry("event.opens_with_black").positive
  # No per-door positive: a door's tag is true of one instance, false in another group's.
  assert [e.id for e in vocab.entries if e.positive] == ["valid_syntax", "event.opens_named_door"]


def test_best_constant_policy_is_the_commonest_winner():
  env = doors.Doors(doors=4)
  seeds = list(range(100, 140))
  winners = collections.Counter(doors.winning_door(env, s) for s in seeds)
  rate, door = doors.best_constant_pass_rate(env, seeds)
  assert rate == max(winners.values()) / 40 == winners[door] / 40
  assert len(winners) == 4 and rate < 1


def test_bad_knobs_are_refused_by_name():
  with pytest.raises(ValueError, match="doors must be an integer in \\[2, 8\\], got 9"):
    envs.make(doors.PATH, doors=9)
  with pytest.raises(ValueError, match="trap must be true or false, got 'yes'"):
    envs.make(doors.PATH, trap="yes")
