"""Vocabulary loading, lenient answer parsing, the rule-based judge, the judge prompt, profiles."""
import dataclasses
import json
import re

import numpy as np
import pytest

from rised_jax import envs
from rised_jax.rubrics import (RuleBasedJudge, Vocabulary, VocabularyError, make_judge,
                               parse_verdict, tag_frequencies)
from rised_jax.rubrics.prompt import JudgePrompt, clip_text
from rised_jax.rubrics.rule_judge import (best_single_tag_accuracy, success_information,
                                          success_predictability)
from rised_jax.types import Event, Group, GroupTags, Task, Trajectory, Turn

POSITIVES = ["valid_syntax", "makes_progress", "uses_feedback", "checks_before_irreversible",
             "recovers_from_mistakes", "efficient"]
NEGATIVES = ["repeats_ineffective_action", "malformed_action", "hallucinated_object", "gave_up",
             "ignores_feedback", "irreversible_losing_step", "loses_ground"]


@pytest.fixture(scope="module")
def vocab():
  return Vocabulary.load("agentic_v1")


def turn(*events, done=False, invalid=False, action="act", observation="obs"):
  return Turn(action_text=action, observation=observation, reward=0.0, done=done,
              invalid=invalid, events=list(events))


def trajectory(turns, success=False, truncated=False, env="sokoban", seed=0, difficulty=None):
  return Trajectory(task=Task(env, seed, difficulty or {}), token_ids=[], loss_mask=[],
                    behaviour_logprobs=[], prompt_len=0, turns=turns, success=success,
                    reward=float(success), truncated=truncated)


def write_vocab(tmp_path, data, name="vocab.json"):
  path = tmp_path / name
  path.write_text(data if isinstance(data, str) else json.dumps(data))
  return str(path)


# --- vocabulary -------------------------------------------------------------------------------

def test_builtin_vocabulary_ids_and_lookups(vocab):
  assert vocab.positive_ids == POSITIVES
  assert vocab.negative_ids == NEGATIVES
  assert vocab.ids == POSITIVES + NEGATIVES
  assert [vocab.index(t) for t in ("valid_syntax", "gave_up", "loses_ground")] == [0, 9, 12]
  np.testing.assert_array_equal(vocab.positive_mask, [True] * 6 + [False] * 7)
  np.testing.assert_array_equal(vocab.negative_mask, [False] * 6 + [True] * 7)
  hot = vocab.multi_hot(["gave_up", "valid_syntax"])
  expected = np.zeros(13, np.float32)
  expected[[0, 9]] = 1
  np.testing.assert_array_equal(hot, expected)
  assert hot.dtype == np.float32
  assert vocab.ids_of(hot) == ["valid_syntax", "gave_up"]
  with pytest.raises(KeyError, match="'flies'.*agentic_v1"):
    vocab.index("flies")
  with pytest.raises(ValueError, match=r"shape \(3,\)"):
    vocab.ids_of(np.zeros(3))


@pytest.mark.parametrize("name,expected", [
    ("valid_syntax", 0), ("VALID_SYNTAX", 0), ("valid syntax", 0), ("Valid-Syntax", 0),
    ("  \"gave_up\" ", 9), ("- gave_up", 9), ("2. gave_up", 9),
    ("issues invalid or malformed actions", 7), ("Issues Invalid Or Malformed Actions.", 7),
    ("gave up!", 9), ("give_up", None), ("", None), ("valid", None)])
def test_resolve_ids_and_descriptions_leniently(vocab, name, expected):
  assert vocab.resolve(name) == expected


def test_load_user_file_and_round_trip(tmp_path):
  entries = [{"id": "polite", "polarity": "+", "description": "Is polite"},
             {"id": "rude", "polarity": "-", "description": "Is rude"}]
  vocab = Vocabulary.load(write_vocab(tmp_path, entries))
  assert vocab.ids == ["polite", "rude"] and vocab.positive_ids == ["polite"]
  assert vocab.entry("rude").description == "Is rude" and len(vocab) == 2
  assert str(tmp_path / "vocab.json") in repr(vocab)


@pytest.mark.parametrize("data,message", [
    ('[{"id": "a", "polarity": "+", "description": "x"},', r"invalid JSON at line 1"),
    ({"entries": []}, r"top level is dict; expected a list"),
    ([], r"no entries"),
    (["a"], r"entry 0 is str .*expected an object"),
    ([{"id": "a", "polarity": "+"}], r"entry 0 \('a'\) lacks key\(s\) \['description'\]"),
    ([{"id": "a", "polarity": "+", "description": "x", "weight": 2}],
     r"entry 0 \('a'\) has unknown key\(s\) \['weight'\]"),
    ([{"id": "a", "polarity": "+", "description": "x"},
      {"id": "a", "polarity": "-", "description": "y"}], r"entry 1 repeats id 'a'"),
    ([{"id": "a", "polarity": "+", "description": "Same words"},
      {"id": "b", "polarity": "-", "description": "same_words"}],
     r"entry 1 \('b'\) is ambiguous with entry 0 \('a'\)"),
    ([{"id": "a", "polarity": "±", "description": "x"}],
     r"entry 0 \('a'\) has polarity '±'; expected \"\+\" or \"-\""),
    ([{"id": "a b", "polarity": "+", "description": "x"}], r"entry 0 has id 'a b'"),
    ([{"id": "a", "polarity": "+", "description": "  "}], r"entry 0 \('a'\) has description"),
])
def test_load_errors_name_file_and_entry(tmp_path, data, message):
  path = write_vocab(tmp_path, data)
  with pytest.raises(VocabularyError, match=message) as err:
    Vocabulary.load(path)
  assert path in str(err.value)


def test_load_missing_file_names_builtins(tmp_path):
  with pytest.raises(VocabularyError, match=r"unknown vocabulary '.*nope\.json'; known: "
                     r"\['agentic_v1'\]; .*; or a JSON file path \(no such file\)"):
    Vocabulary.load(str(tmp_path / "nope.json"))


# --- lenient parsing --------------------------------------------------------------------------

@pytest.mark.parametrize("answer,tags,unjudged,unknown", [
    ('{"tags": ["valid_syntax", "gave_up"]}', {"valid_syntax", "gave_up"}, False, 0),
    ('Here you go:\n```json\n{"tags": ["Efficient"]}\n```\nHope it helps', {"efficient"},
     False, 0),
    ('Sure. {"Tags": ["takes no wasted or losing turns", "GAVE UP"]} done.',
     {"efficient", "gave_up"}, False, 0),
    ('["malformed_action"]', {"malformed_action"}, False, 0),
    ('{"tags": "valid_syntax, loses_ground"}', {"valid_syntax", "loses_ground"}, False, 0),
    ('{"tags": {"valid_syntax": true, "gave_up": false}}', {"valid_syntax"}, False, 0),
    ('{"tags": [{"id": "gave_up"}, {"name": "efficient"}]}', {"gave_up", "efficient"}, False, 0),
    ('{"rubrics": ["valid_syntax", "teleports", 7]}', {"valid_syntax"}, False, 2),
    ('{"tags": []}', set(), False, 0),
    ('{"tags": ["teleports", "flies"]}', set(), True, 2),
    ('{"tags": [1, null]}', set(), True, 2),
    ('{"tags": 5}', set(), True, 0),
    ('{"tags": null}', set(), True, 0),
    ('{"verdict": "good"}', set(), True, 0),
    ('{"tags": ["valid_syntax", "makes_pr', set(), True, 0),
    ('no json here', set(), True, 0),
    ('the list [] is empty', set(), True, 0),
    ('', set(), True, 0),
    (None, set(), True, 0),
])
def test_parse_verdict(vocab, answer, tags, unjudged, unknown):
  verdict = parse_verdict(answer, vocab)
  assert set(vocab.ids_of(verdict.tags)) == tags
  assert verdict.unjudged == unjudged
  assert len(verdict.unknown_tags) == unknown
  assert verdict.raw == (answer or "")


# --- rule-based judge -------------------------------------------------------------------------

P, S, N, R, I = (Event.PROGRESS, Event.SUCCESS, Event.NO_EFFECT, Event.REPEATED_ACTION,
                 Event.INVALID_ACTION)
RULE_CASES = {
    "clean success": (
        trajectory([turn(P), turn(P), turn(P, S, done=True)], success=True),
        {"valid_syntax", "makes_progress", "efficient"}),
    "success after a bump": (
        trajectory([turn(N), turn(P), turn(P, S, done=True)], success=True),
        {"valid_syntax", "makes_progress", "recovers_from_mistakes"}),
    "bumps the wall twice, then runs out of turns": (
        trajectory([turn(N), turn(R, N), turn(P)], truncated=True),
        {"valid_syntax", "repeats_ineffective_action", "recovers_from_mistakes"}),
    "repeats an invalid action": (
        trajectory([turn(invalid=True), turn(R, I)], truncated=True),
        {"malformed_action", "repeats_ineffective_action"}),
    "repeats a useful action": (
        trajectory([turn(P), turn(R, P)], truncated=True),
        {"valid_syntax", "makes_progress"}),
    "invents an object, then stops": (
        trajectory([turn(Event.UNKNOWN_OBJECT), turn("gave_up", done=True)]),
        {"valid_syntax", "hallucinated_object", "gave_up"}),
    "stops without a done turn": (
        trajectory([turn(P), turn()]),
        {"valid_syntax", "makes_progress", "efficient", "gave_up"}),
    "no turn at all": (trajectory([]), {"gave_up"}),
    "falls in a hole": (   # the losing step is its own tag, no waste (issue 14)
        trajectory([turn(P), turn(Event.IRREVERSIBLE_FAILURE, done=True)]),
        {"valid_syntax", "makes_progress", "efficient", "irreversible_losing_step"}),
    "follows feedback": (
        trajectory([turn(Event.USED_FEEDBACK), turn(Event.USED_FEEDBACK, S, done=True)],
                   success=True),
        {"valid_syntax", "uses_feedback", "efficient"}),
    "uses and ignores feedback": (
        trajectory([turn(Event.USED_FEEDBACK), turn(Event.IGNORED_FEEDBACK)], truncated=True),
        {"valid_syntax", "ignores_feedback"}),
    "walks away from the goal": (
        trajectory([turn(Event.REGRESS), turn(Event.REGRESS), turn(P)], truncated=True),
        {"valid_syntax", "loses_ground", "recovers_from_mistakes"}),
    "as many steps back as forward": (
        trajectory([turn(Event.REGRESS), turn(P)], truncated=True),
        {"valid_syntax", "makes_progress", "recovers_from_mistakes"}),
    "successful but wasteful": (
        trajectory([turn(P), turn(R), turn(P, S, done=True)], success=True),
        {"valid_syntax", "makes_progress"}),
    "repeats an action that now has no effect": (
        trajectory([turn(P), turn(R, N)], truncated=True),
        {"valid_syntax", "makes_progress", "repeats_ineffective_action"}),
    "acts on an unknown object the env refused": (
        trajectory([turn(Event.UNKNOWN_OBJECT, invalid=True), turn(P)], truncated=True),
        {"valid_syntax", "makes_progress", "hallucinated_object", "recovers_from_mistakes"}),
    "failed at the env's own turn limit": (
        trajectory([turn(P), turn(done=True)]),
        {"valid_syntax", "makes_progress", "efficient"}),
}


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_rule_based_tags(vocab, name):
  traj, expected = RULE_CASES[name]
  verdict = RuleBasedJudge(vocab).verdict(traj)
  assert set(vocab.ids_of(verdict.tags)) == expected
  assert not verdict.unjudged


def test_no_rule_reads_the_outcome(vocab):
  """Tags describe behaviour: the same turns with the outcome flipped get the same tags, and a
  winning turn that reports only `success` is no progress (issue 14: `efficient` required
  success and `makes_progress` counted the success event)."""
  judge = RuleBasedJudge(vocab)
  for name, (traj, _) in RULE_CASES.items():
    flipped = dataclasses.replace(traj, success=not traj.success, reward=1.0 - traj.reward)
    assert (judge.verdict(flipped).tags == judge.verdict(traj).tags).all(), name
  won_at_once = trajectory([turn(S, done=True)], success=True)
  assert set(vocab.ids_of(judge.verdict(won_at_once).tags)) == {"valid_syntax", "efficient"}
  # Environments report the winning move's progress / used feedback too: not read either.
  for won in ([turn(P, S, done=True)], [turn(N), turn(P, S, done=True)],
              [turn(Event.USED_FEEDBACK, S, done=True)]):
    tags = set(vocab.ids_of(judge.verdict(trajectory(won, success=True)).tags))
    assert not tags & {"makes_progress", "recovers_from_mistakes", "uses_feedback"}, won


def test_tags_of_real_episodes_do_not_say_who_won(vocab):
  """A Countdown game lost by a legal move is as efficient as a won one (the losing step is
  tagged, not counted as waste), and a one-move FrozenLake win shows no `makes_progress`."""
  judge = RuleBasedJudge(vocab)

  def first_move(name, difficulty, wanted):
    env = envs.make(name, **difficulty)
    env.reset(0)
    for action in env.action_space():
      env.reset(0)
      _, _, done, info = env.step(envs.format_answer(action))
      if done and not info["invalid"] and info["success"] == wanted:
        return trajectory([Turn(action, "", float(wanted), True, False, info["events"])],
                          success=wanted, env=name)
    raise AssertionError(f"{name}: no first move with success={wanted}")

  lost = first_move("countdown", {}, wanted=False)
  assert {"efficient", "irreversible_losing_step"} <= set(vocab.ids_of(judge.verdict(lost).tags))
  won = first_move("frozenlake", dict(size=2, holes=0, min_distance=1, max_turns=1), wanted=True)
  assert "progress" in won.turns[0].events
  assert set(vocab.ids_of(judge.verdict(won).tags)) == {"valid_syntax", "efficient"}


def test_predictability_measures_on_a_hand_worked_pool():
  # Tag 0 is on for 3 of 4 wins and 1 of 4 losses (agrees on 6 of 8); tag 1 never set (4 of 8).
  tags = np.array([[1, 0]] * 3 + [[0, 0]] + [[1, 0]] + [[0, 0]] * 3, np.float32)
  wins = np.array([1, 1, 1, 1, 0, 0, 0, 0], bool)
  assert best_single_tag_accuracy(tags, wins) == 6 / 8
  assert best_single_tag_accuracy(1 - tags, wins) == 6 / 8   # "success iff not set" counts
  # I(V; S) for the 2x2 table [[3, 1], [1, 3]] / 8 over H(S) = 1 bit: 1 - H(1/4) bits.
  h = -(0.25 * np.log2(0.25) + 0.75 * np.log2(0.75))
  np.testing.assert_allclose(success_information(tags, wins), 1 - h, rtol=1e-12)
  assert success_information(tags[:, :1], wins) == success_information(tags, wins)
  assert success_information(tags, np.ones(8, bool)) == 0.0
  assert success_information(np.array([[1], [0]]), np.array([1, 0], bool)) == 1.0
  with pytest.raises(ValueError, match="expected"):
    best_single_tag_accuracy(np.zeros((3, 2)), np.zeros(2))


def test_success_predictability_on_a_hand_worked_pool():
  # Vectors: a (3 wins, 1 loss), b (0 wins, 2 losses), c (1 win, 1 loss): the best rule is
  # right on 3 + 2 + 1 of 8 rollouts; 4 of 8 succeed, so a constant guess is right on 4.
  a, b, c = [1, 0, 0], [0, 1, 0], [1, 1, 0]
  tags = np.array([a, a, a, a, b, b, c, c], np.float32)
  wins = np.array([1, 1, 1, 0, 0, 0, 1, 0], bool)
  assert success_predictability(tags, wins) == (6 / 8, 4 / 8)
  assert success_predictability(np.zeros((5, 3)), np.array([1, 0, 0, 0, 0])) == (0.8, 0.8)
  with pytest.raises(ValueError, match="expected"):
    success_predictability(np.zeros((0, 3)), np.zeros(0))


def test_every_rule_both_fires_and_stays_silent(vocab):
  judge = RuleBasedJudge(vocab)
  fired = set().union(*(expected for _, expected in RULE_CASES.values()))
  silent = set().union(*(set(judge.rules) - expected for _, expected in RULE_CASES.values()))
  assert fired == set(judge.rules) == silent
  assert set(vocab.ids) - set(judge.rules) == {"checks_before_irreversible"}


def test_rule_options_and_event_spellings(vocab):
  # Half the turns before the win advance (the winning turn is not read: issue 14).
  slow = trajectory([turn(P), turn(), turn(), turn(P), turn(P, S, done=True)], success=True)
  assert "makes_progress" in vocab.ids_of(RuleBasedJudge(vocab).verdict(slow).tags)
  strict = RuleBasedJudge(vocab, progress_min_fraction=0.75)
  assert "makes_progress" not in vocab.ids_of(strict.verdict(slow).tags)
  wasteful = RULE_CASES["successful but wasteful"][0]
  lenient = RuleBasedJudge(vocab, efficient_max_wasted_turns=1)
  assert "efficient" in vocab.ids_of(lenient.verdict(wasteful).tags)
  # Environments may report Event members or their string values.
  as_strings = trajectory([turn("no_effect"), turn("repeated_action", "no_effect")],
                          truncated=True)
  assert "repeats_ineffective_action" in vocab.ids_of(RuleBasedJudge(vocab).verdict(
      as_strings).tags)
  with pytest.raises(ValueError, match="progress_min_fraction=0"):
    RuleBasedJudge(vocab, progress_min_fraction=0)


def test_rule_judge_on_user_vocabularies():
  subset = Vocabulary.from_json_data(
      [{"id": "gave_up", "polarity": "-", "description": "stops early"},
       {"id": "polite", "polarity": "+", "description": "is polite"}], "subset.json")
  judge = RuleBasedJudge(subset)
  assert set(judge.rules) == {"gave_up"}
  np.testing.assert_array_equal(judge.verdict(trajectory([])).tags, [1, 0])
  foreign = Vocabulary.from_json_data(
      [{"id": "polite", "polarity": "+", "description": "is polite"}], "foreign.json")
  with pytest.raises(ValueError, match="foreign.json has none of the ids"):
    RuleBasedJudge(foreign)


def test_event_tags_apply_exactly_when_a_turn_reports_their_event():
  vocab = Vocabulary.from_json_data(
      [{"id": "event.opens_with_red", "polarity": "+", "description": "Opens with red"},
       {"id": "event.opens_with_black", "polarity": "-", "description": "Opens with black"}],
      "doors.json")   # only event tags: accepted, every tag can be set
  judge = RuleBasedJudge(vocab)
  cases = {(): [0, 0], ("opens_with_red",): [1, 0], ("opens_with_black",): [0, 1],
           ("opens_with_red", "opens_with_black"): [1, 1], ("red",): [0, 0]}
  for events, expected in cases.items():
    np.testing.assert_array_equal(judge.verdict(trajectory([turn(*events, done=True)])).tags,
                                  expected)
  # The event may be reported on any turn, as an Event-like string.
  later = trajectory([turn("progress"), turn("opens_with_red", done=True)])
  np.testing.assert_array_equal(judge.verdict(later).tags, [1, 0])


def test_judge_returns_tags_per_group_and_counts(vocab):
  cases = [RULE_CASES["clean success"][0], RULE_CASES["no turn at all"][0]]
  groups = [Group(Task("sokoban", 0), [cases[0]]), Group(Task("sokoban", 1), [cases[1]])]
  tags, stats = make_judge("rules", vocab).judge(groups)
  assert stats.as_dict() == {"judged": 2, "unjudged": 0, "unknown_tags": 0, "cache_hits": 0,
                             "requests": 0, "retries": 0, "failed_requests": 0}
  assert len(tags) == 2
  assert vocab.ids_of(tags[1].tags[0]) == ["gave_up"]
  assert tags[0].tags.dtype == np.float32
  assert not any(t.unjudged.any() for t in tags)


def test_make_judge_errors(vocab):
  with pytest.raises(ValueError, match=r"^config\.judge\.backend: unknown judge 'llm'; known: "
                     r"\['genai', 'inprocess', 'openai', 'rules'\]; or an entry point"):
    make_judge("llm", vocab)
  with pytest.raises(ValueError, match=r"judge 'rules' has no option\(s\) \['model'\]"):
    make_judge("rules", vocab, model="x")
  with pytest.raises(ValueError, match=r"judge 'inprocess' has no option\(s\) \['temprature'\]"):
    make_judge("inprocess", vocab, generate_text=list, temprature=0.0)


# --- prompt -----------------------------------------------------------------------------------

def test_clip_text_keeps_head_and_tail():
  text = "".join(chr(ord("a") + i % 26) for i in range(1000))
  for limit in (40, 100, 999):
    clipped = clip_text(text, limit)
    head, count, tail = re.fullmatch(r"(\w*) \[\.\.\.(\d+) chars omitted\.\.\.\] (\w*)",
                                     clipped).groups()
    assert len(clipped) == limit
    assert text.startswith(head) and text.endswith(tail) and abs(len(head) - len(tail)) <= 1
    assert len(head) + int(count) + len(tail) == len(text)
  assert clip_text("short", 100) == "short"


def test_prompt_renders_task_transcript_and_vocabulary(vocab):
  turns = [turn(action=f"action {i}", observation=f"observation {i}") for i in range(10)]
  turns[3].action_text = "x" * 5000
  traj = trajectory(turns, truncated=True, env="maze", seed=7, difficulty={"size": 5})
  text = JudgePrompt(vocab, max_turns=6, max_chars=100,
                     describe_task=lambda t: f"Reach the exit of {t.task.key}.").render(traj)
  assert "Environment: maze (instance 7)" in text and "Details: size=5" in text
  assert "Reach the exit of maze:7." in text
  kept = [i for i in range(10) if f"Agent: action {i}\n" in text]
  assert kept == [0, 1, 2, 7, 8, 9]
  assert "[... 4 turns omitted ...]" in text
  assert "ran out of its turn or token budget" in text and "after 10 turns" in text
  for entry in vocab.entries:
    assert f"- {entry.id} ({entry.polarity}): {entry.description}" in text
  long_turn = JudgePrompt(vocab, max_turns=20, max_chars=100).render(traj)
  assert "x" * 200 not in long_turn and "chars omitted" in long_turn
  with pytest.raises(ValueError, match="max_turns=1"):
    JudgePrompt(vocab, max_turns=1)


def test_custom_prompt_template(vocab, tmp_path):
  path = tmp_path / "p.jinja"
  path.write_text("{{ env }}|{{ turns | length }}|{{ vocabulary | length }}|{{ success }}")
  text = JudgePrompt(vocab, template_path=str(path)).render(
      trajectory([turn(), turn()], success=True))
  assert text == "sokoban|2|13|True"
  path.write_text("{{ no_such_variable }}")
  with pytest.raises(Exception, match="no_such_variable"):
    JudgePrompt(vocab, template_path=str(path)).render(trajectory([]))
  with pytest.raises(FileNotFoundError, match="missing.jinja"):
    JudgePrompt(vocab, template_path=str(tmp_path / "missing.jinja"))


# --- profiles ---------------------------------------------------------------------------------

def test_tag_frequencies_per_environment(vocab):
  rng = np.random.default_rng(0)
  groups, tags, tags_by_env = [], [], {"maze": [], "wordle": []}
  for i in range(6):
    env = "maze" if i % 2 else "wordle"
    rows = (rng.random((4, 13)) < 0.4).astype(np.float32)
    unjudged = np.arange(4) == 3   # the judge failed: not counted
    tags_by_env[env] += list(rows[~unjudged])
    groups.append(Group(Task(env, i), [trajectory([], env=env, seed=i) for _ in range(4)]))
    tags.append(GroupTags(rows, unjudged))
  freqs = tag_frequencies(groups, tags, vocab)
  assert sorted(freqs) == ["maze", "wordle"]
  for env, rows in tags_by_env.items():
    np.testing.assert_allclose([freqs[env][t] for t in vocab.ids], np.mean(rows, axis=0))


def play(name, seed, actions=None):
  """An episode of a built-in environment: the oracle's actions, or `actions` then the oracle."""
  env = envs.make(name)
  env.reset(seed)
  turns, info, done, scripted = [], {}, False, list(actions or [])
  while not done:
    action = scripted.pop(0) if scripted else env.oracle()[0]
    observation, reward, done, info = env.step(envs.format_answer(action))
    turns.append(Turn(action, observation, reward, done, info["invalid"], info["events"]))
  return trajectory(turns, success=info["success"], truncated=info["truncated"], env=name,
                    seed=seed)


@pytest.mark.parametrize("name", envs.names())
def test_rule_judge_on_built_in_environment_episodes(vocab, name):
  judge = RuleBasedJudge(vocab)
  solved = vocab.ids_of(judge.verdict(play(name, seed=0)).tags)
  assert {"valid_syntax", "efficient"} <= set(solved)
  assert not set(solved) & set(NEGATIVES)
  quitter = vocab.ids_of(judge.verdict(play(name, seed=0, actions=["give up"])).tags)
  assert "gave_up" in quitter and "efficient" not in quitter
  fumbler = vocab.ids_of(judge.verdict(play(name, seed=0, actions=["%%%", "%%%"])).tags)
  assert {"malformed_action", "repeats_ineffective_action"} <= set(fumbler)
