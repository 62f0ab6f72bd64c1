"""Teacher prefixes (the positive-rubric fallback chain) and negative-rubric guidance memory."""
import json

import numpy as np
import pytest

from rised_jax.rubrics import Vocabulary
from rised_jax.teach import (GuidanceMemory, PositiveMemory, PositiveTeacher, available_positives,
                             positive_teacher_prefix)
from rised_jax.teach.positive import positive_counts
from rised_jax.types import Group, GroupTags, Task, Trajectory

SYSTEM = "You are an agent in a grid world."


@pytest.fixture(scope="module")
def vocab():
  return Vocabulary.load("agentic_v1")


def group(vocab, env, seed, *rollouts, system_prompt=""):
  """A group and its judge's answer; `rollouts`: (success, tags) pairs, or (success, tags,
  unjudged)."""
  trajs = [Trajectory(Task(env, seed), [], [], [], 0, [], success=r[0], reward=float(r[0]))
           for r in rollouts]
  tags = GroupTags(np.stack([vocab.multi_hot(r[1]) for r in rollouts]),
                   np.asarray([len(r) > 2 and r[2] for r in rollouts], bool))
  return Group(Task(env, seed), trajs, system_prompt=system_prompt), tags


def pool_of(*pairs):
  """(group, tags) pairs -> (groups, tags)."""
  return [g for g, _ in pairs], [t for _, t in pairs]


# --- the positive fallback chain -------------------------------------------------------------

def test_group_level_positives_ranked_by_frequency(vocab):
  g = group(vocab, "maze", 0,
            (True, ["makes_progress", "valid_syntax", "gave_up"]),
            (True, ["makes_progress"]),
            (False, ["efficient", "valid_syntax"]),             # failed: not counted
            (True, ["uses_feedback"], True))                     # unjudged: not counted
  positives = available_positives(0, *pool_of(g), vocab)
  assert positives.source == "group"
  assert positives.tags == ("makes_progress", "valid_syntax")   # 2 votes, then 1


def test_pool_level_positives_from_the_same_environment_only(vocab):
  target = group(vocab, "maze", 0, (False, ["valid_syntax"]), (True, ["gave_up"]))
  same_env = group(vocab, "maze", 1, (True, ["efficient"]), (True, ["efficient", "uses_feedback"]))
  other_env = group(vocab, "wordle", 2, (True, ["makes_progress"]))
  positives = available_positives(1, *pool_of(other_env, target, same_env), vocab)
  assert positives.source == "pool"
  assert positives.tags == ("efficient", "uses_feedback")
  # The group itself does not count as "elsewhere in the pool".
  alone = available_positives(0, *pool_of(target, other_env), vocab)
  assert alone.source == "none" and alone.tags == ()


def test_tags_that_do_not_match_their_groups_are_refused(vocab):
  """A group of 1 rollout given 2 tag rows used to broadcast and count both rows."""
  one, _ = group(vocab, "maze", 0, (True, ["valid_syntax"]))
  _, two_rows = group(vocab, "maze", 1, (True, ["efficient"]), (True, ["efficient"]))
  with pytest.raises(ValueError, match=r"group 0 \(maze:0\) has 1 rollouts but its tags have "
                     r"shape \(2, 13\)"):
    positive_counts([one], [two_rows], vocab)
  with pytest.raises(ValueError, match="0 GroupTags for a pool of 1 groups"):
    available_positives(0, [one], [], vocab)


def test_memory_level_and_expiry(vocab):
  memory = PositiveMemory(vocab, max_age=3)
  memory.update(*pool_of(group(vocab, "maze", 5, (True, ["valid_syntax"]))), step=1)
  memory.update(*pool_of(group(vocab, "maze", 6, (True, ["efficient", "valid_syntax"]))), step=2)
  memory.update(*pool_of(group(vocab, "maze", 7, (False, ["makes_progress"]))), step=2)
  target = pool_of(group(vocab, "maze", 0, (False, [])))
  positives = available_positives(0, *target, vocab, memory, step=4)
  assert positives.source == "memory"
  assert positives.tags == ("valid_syntax", "efficient")   # both seen at step 2: vocab order
  assert memory.recall("maze", step=5) == ["valid_syntax", "efficient"]
  assert memory.recall("maze", step=6) == []                 # older than max_age
  assert memory.recall("wordle", step=2) == []
  none = available_positives(0, *target, vocab, memory, step=6)
  assert none.source == "none"


def test_chain_prefers_earlier_levels_and_respects_configured_sources(vocab):
  memory = PositiveMemory(vocab)
  memory.update(*pool_of(group(vocab, "maze", 9, (True, ["checks_before_irreversible"]))), step=0)
  own = group(vocab, "maze", 0, (True, ["valid_syntax"]))
  other = group(vocab, "maze", 1, (True, ["efficient"]))
  assert available_positives(0, *pool_of(own, other), vocab, memory, 1).source == "group"
  no_own = group(vocab, "maze", 2, (False, []))
  assert available_positives(0, *pool_of(no_own, other), vocab, memory, 1).source == "pool"
  assert available_positives(0, *pool_of(no_own), vocab, memory, 1).source == "memory"
  only_group = available_positives(0, *pool_of(no_own, other), vocab, memory, 1,
                                   sources=("group",))
  assert only_group.source == "none"
  memory_first = available_positives(0, *pool_of(own), vocab, memory, 1,
                                     sources=("memory", "group"))
  assert memory_first.tags == ("checks_before_irreversible",)
  with pytest.raises(ValueError, match="unknown source 'elsewhere'"):
    available_positives(0, *pool_of(own), vocab, memory, 1, sources=("elsewhere",))


def test_prefix_text_and_none_without_positives(vocab):
  g = pool_of(group(vocab, "maze", 0, (True, ["efficient", "valid_syntax"]), (True, ["efficient"])))
  prefix, positives = positive_teacher_prefix(SYSTEM, 0, *g, vocab)
  # The block comes first: after the system prompt it took SmolLM2 off the action format
  # (benchmarks/teacher_context.py).
  assert prefix == ("Behaviours that succeed here:\n"
                    "- Takes no wasted or losing turns\n"
                    "- Uses valid action syntax on every turn\n\n"
                    "You are an agent in a grid world.")
  assert positives.source == "group"
  capped, _ = positive_teacher_prefix(SYSTEM, 0, *g, vocab, max_tags=1)
  assert capped.startswith("Behaviours that succeed here:\n- Takes no wasted or losing turns\n\n")
  bare, _ = positive_teacher_prefix("", 0, *g, vocab, max_tags=1)
  assert bare == "Behaviours that succeed here:\n- Takes no wasted or losing turns"
  failed = pool_of(group(vocab, "maze", 1, (False, ["efficient"])))
  prefix, positives = positive_teacher_prefix(SYSTEM, 0, *failed, vocab)
  assert prefix is None and positives.source == "none" and positives.tags == ()


def test_teacher_assign_returns_prefixes_counts_sources_and_updates_memory_afterwards(vocab):
  teacher = PositiveTeacher(vocab)
  winners = group(vocab, "maze", 0, (True, ["valid_syntax"]), system_prompt="Play maze.")
  losers = group(vocab, "maze", 1, (False, []), system_prompt="Play maze.")
  stranded = group(vocab, "wordle", 2, (False, []), system_prompt="Play wordle.")
  prefixes, counts = teacher.assign([0, 1, 2], *pool_of(winners, losers, stranded), step=0)
  assert counts == {"group": 1, "pool": 1, "memory": 0, "none": 1}
  assert prefixes[0] == prefixes[1] == (
      "Behaviours that succeed here:\n- Uses valid action syntax on every turn\n\nPlay maze.")
  assert prefixes[2] is None
  # Step 1: a maze group alone in its pool now falls back on the memory of step 0.
  later = group(vocab, "maze", 3, (False, []), system_prompt="Play.")
  prefixes, counts = teacher.assign([0], *pool_of(later), step=1)
  assert counts["memory"] == 1
  assert prefixes[0] == "Behaviours that succeed here:\n- Uses valid action syntax on every turn\n\nPlay."
  # State round trip (plain data) restores the memory exactly.
  state = json.loads(json.dumps(teacher.state_dict()))
  resumed = PositiveTeacher(vocab)
  resumed.load_state_dict(state)
  assert resumed.memory.last_seen == teacher.memory.last_seen
  with pytest.raises(ValueError, match="'gave_up'.*not a positive tag"):
    resumed.load_state_dict({"memory": {"last_seen": {"maze": {"gave_up": 0}}}})


def test_teacher_options_are_validated(vocab, tmp_path):
  with pytest.raises(ValueError, match=r"sources=\['group', 'group'\]"):
    PositiveTeacher(vocab, sources=("group", "group"))
  with pytest.raises(ValueError, match="max_tags=0"):
    PositiveTeacher(vocab, max_tags=0)
  path = tmp_path / "t.jinja"
  path.write_text("{{ system_prompt }} | {{ behaviours | join(', ') }}")
  teacher = PositiveTeacher(vocab, template_path=str(path))
  g = group(vocab, "maze", 0, (True, ["efficient"]), system_prompt="S")
  prefixes, _ = teacher.assign([0], *pool_of(g), 0)
  assert prefixes == ["S | Takes no wasted or losing turns"]


# --- guidance memory --------------------------------------------------------------------------

def negatives_group(vocab, env, seed, tag_lists, unjudged=()):
  """A failed group whose rollout i has tags tag_lists[i], and its tags: (groups, tags)."""
  return pool_of(group(vocab, env, seed, *[(False, tags, i in unjudged) for i, tags in
                                           enumerate(tag_lists)]))


def test_guidance_frequencies_follow_a_hand_computed_ema(vocab):
  memory = GuidanceMemory(vocab, rate=0.25, threshold=0.3, top_m=2)
  steps = [
      [["gave_up", "malformed_action"], ["gave_up"], [], ["valid_syntax"]],   # gave_up 2/4
      [["malformed_action"], ["malformed_action", "gave_up"]],                 # both present
      [[], []],
  ]
  for tags in steps:
    memory.update(*negatives_group(vocab, "maze", 0, tags + [["gave_up"]],
                                   unjudged={len(tags)}))
  gave_up = 2 / 4
  gave_up += 0.25 * (1 / 2 - gave_up)
  gave_up += 0.25 * (0 - gave_up)
  malformed = 1 / 4
  malformed += 0.25 * (2 / 2 - malformed)
  malformed += 0.25 * (0 - malformed)
  freqs = memory.frequencies("maze")
  assert sorted(freqs) == sorted(vocab.negative_ids)
  assert freqs["gave_up"] == pytest.approx(gave_up)
  assert freqs["malformed_action"] == pytest.approx(malformed)
  assert all(v == 0 for k, v in freqs.items() if k not in ("gave_up", "malformed_action"))
  # An environment absent from an update keeps its frequencies.
  memory.update(*negatives_group(vocab, "wordle", 0, [["loses_ground"]]))
  assert memory.frequencies("maze")["gave_up"] == pytest.approx(gave_up)
  assert memory.frequencies("wordle")["loses_ground"] == 1.0
  assert memory.frequencies("sokoban")["gave_up"] == 0.0


def test_guidance_zero_init(vocab):
  memory = GuidanceMemory(vocab, rate=0.5, init="zero")
  memory.update(*negatives_group(vocab, "maze", 0, [["gave_up"]]))
  memory.update(*negatives_group(vocab, "maze", 0, [["gave_up"]]))
  assert memory.frequencies("maze")["gave_up"] == pytest.approx(0.75)


def test_hints_only_above_threshold_in_top_m_order(vocab):
  memory = GuidanceMemory(vocab, rate=0.5, threshold=0.3, top_m=2)
  # Frequencies after one update: loses_ground 0.75, gave_up 0.5, malformed_action 0.5,
  # hallucinated_object 0.25 (below threshold), ignores_feedback 0.3 (not strictly above).
  counts = {"loses_ground": 15, "gave_up": 10, "malformed_action": 10,
            "hallucinated_object": 5, "ignores_feedback": 6}
  rollouts = [[tag for tag, n in counts.items() if i < n] for i in range(20)]
  memory.update(*negatives_group(vocab, "maze", 0, rollouts))
  assert memory.active_tags("maze") == ["loses_ground", "malformed_action"]
  assert memory.hint("maze") == ("Avoid: Moves away from the goal more often than toward it; "
                                 "Issues invalid or malformed actions.")
  wide = GuidanceMemory(vocab, rate=0.5, threshold=0.3, top_m=10)
  wide.update(*negatives_group(vocab, "maze", 0, rollouts))
  assert wide.active_tags("maze") == ["loses_ground", "malformed_action", "gave_up"]
  assert memory.hint("wordle") == ""
  calm = GuidanceMemory(vocab, threshold=0.9)
  calm.update(*negatives_group(vocab, "maze", 0, rollouts))
  assert calm.hint("maze") == "" and calm.active_tags("maze") == []


def test_guidance_state_round_trip_and_errors(vocab):
  memory = GuidanceMemory(vocab, rate=0.3)
  for seed in range(3):
    memory.update(*negatives_group(vocab, "maze", seed, [["gave_up"], [], ["loses_ground"]]))
  state = json.loads(json.dumps(memory.state_dict()))
  resumed = GuidanceMemory(vocab, rate=0.3)
  resumed.load_state_dict(state)
  nxt = negatives_group(vocab, "maze", 9, [["gave_up"], ["gave_up"]])
  memory.update(*nxt)
  resumed.update(*nxt)
  assert resumed.frequencies("maze") == memory.frequencies("maze")
  assert resumed.hint("maze") == memory.hint("maze")
  with pytest.raises(ValueError, match="saved tags for env 'maze'"):
    resumed.load_state_dict({"frequencies": {"maze": {"gave_up": 0.5}}})
  with pytest.raises(ValueError, match="rate=0"):
    GuidanceMemory(vocab, rate=0)
  with pytest.raises(ValueError, match="init='one'"):
    GuidanceMemory(vocab, init="one")
  positive_only = Vocabulary.from_json_data(
      [{"id": "polite", "polarity": "+", "description": "is polite"}], "pos.json")
  with pytest.raises(ValueError, match="pos.json has no negative tag"):
    GuidanceMemory(positive_only)
  bad, _ = negatives_group(vocab, "maze", 0, [[]])
  with pytest.raises(ValueError, match=r"maze:0 has tags of width 3; vocabulary agentic_v1 .*has "
                     r"13 entries"):
    memory.update(bad, [GroupTags(np.zeros((1, 3), np.float32), np.zeros(1, bool))])
