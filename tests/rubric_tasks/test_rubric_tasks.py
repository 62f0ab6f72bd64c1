"""The rubric task format, its JSONL loader, the built-in task set and the deterministic checker."""
import json

import numpy as np
import pytest

from rised_jax.rubric_tasks import checks, tasks, text


def _answer(raw: str) -> text.Answer:
  return text.Answer(raw)


def _holds(spec: dict, raw: str) -> bool:
  return checks.parse_check(spec, "test").holds(_answer(raw))


@pytest.fixture(scope="module")
def builtin():
  return tasks.builtin_task_set()


@pytest.fixture(scope="module")
def by_id(builtin):
  return {t.id: t for t in builtin.tasks}


# --- text analysis --------------------------------------------------------------------------


def test_sentence_splitting_rules():
  raw = ("Light travels at 3.0 × 10^8 m/s. E. coli lives in the gut, e.g. in humans! Vitamin C. It helps?\n"
         "- an unpunctuated item\n- another item\n\nA new paragraph without a stop")
  # By hand: the decimal, "E. coli" (initial + lower-case word) and "e.g." do not split; "Vitamin C."
  # followed by "It" does; each bullet item and the paragraph after the blank line are sentences.
  assert _answer(raw).sentences == [
      "light travels at 3.0 × 10^8 m/s.", "e. coli lives in the gut, e.g. in humans!", "vitamin c.", "it helps?",
      "- an unpunctuated item", "- another item", "a new paragraph without a stop"]
  # A single line break inside a paragraph is not a boundary; stray markdown is not a sentence.
  assert _answer("The heart has four\nchambers.\n\n**\n").sentences == ["the heart has four\nchambers."]


def test_words_and_bullets_counts():
  answer = _answer("- Evaporation — water turns to vapour\n* Condensation\n1. Rain\n2) Runoff\n-not a bullet")
  # Words by hand: Evaporation water turns to vapour (5), Condensation (6), Rain (7), Runoff (8),
  # -not a bullet (11); the markers "-", "*", "1.", "2)" and the dash "—" are not words.
  assert answer.num_words == 11
  assert answer.num_bullets == 4


@pytest.mark.parametrize("raw, values", [
    ("3 × 10^8 m/s, 3e8, 3x10**8 and 3·10⁸", [3e8, 3e8, 3e8, 3e8]),
    ("300,000 km/s or 1.5 million km", [3e5, 1.5e6]),
    ("-5 °C, covid-19 and 60-100 bpm", [-5.0, 19.0, 60.0, 100.0]),
    ("four chambers, twenty-three pairs, ninety nine", [4.0, 23.0, 99.0]),
    ("10⁻³ and 2^10 but not H2O", [1e-3, 1024.0]),
])
def test_number_extraction(raw, values):
  np.testing.assert_allclose([n.value for n in _answer(raw).numbers], values, rtol=1e-12)


def test_phrase_patterns():
  regex = text.phrase_regex("scatter* ... short* wavelength*")
  assert regex.search(text.normalize("Scattering favours SHORT-wavelength light"))
  assert regex.search("scattered much more at shorter wavelengths")        # gap of 3 words
  assert not regex.search("scattered a b c d e shorter wavelengths")        # gap of 5 words
  assert not text.phrase_regex("ion").search("radiation")                   # no glued letters
  assert text.phrase_regex("red blood cell*").search("red-blood cells")     # hyphen = space
  for bad in ["", "sc*atter", "... wavelength", "a ... ... b"]:
    with pytest.raises(ValueError):
      text.phrase_regex(bad)


# --- checks ---------------------------------------------------------------------------------


def test_keywords_any_of_synonyms_all_groups_and_same_sentence():
  spec = {"type": "keywords", "all_of": [["scatter*", "diffus*"], ["molecule*", "air"]]}
  assert _holds(spec, "Light is SCATTERED by air.")
  assert _holds(spec, "Diffusion happens. Molecules do it.")                # groups in different sentences
  assert not _holds(spec, "Light is scattered.")                            # second group missing
  assert not _holds({**spec, "same_sentence": True}, "Diffusion happens. Molecules do it.")
  assert _holds({**spec, "same_sentence": True}, "Diffusion happens by molecules.")


def test_claim_negation_guard():
  spec = {"type": "claim", "any_of": ["reflect* ... ocean*", "antibiotics ... kill* viruses"]}
  assert _holds(spec, "The sky reflects the ocean.")
  assert not _holds(spec, "It is a myth that the sky reflects the ocean.")  # cue before the phrase
  assert not _holds(spec, "Antibiotics do not kill viruses.")               # cue inside the match
  assert _holds(spec, "Blue light scatters. The sky reflects the ocean.")   # cue-free sentence
  assert _holds({**spec, "negation_guard": False}, "It is a myth that the sky reflects the ocean.")
  # A cue spelled out by the phrase itself does not negate it.
  assert _holds({"type": "claim", "any_of": ["never strikes the same place twice"]},
                "Lightning never strikes the same place twice.")


def test_number_tolerance_units_and_ranges():
  spec = {"type": "number", "value": 37, "abs_tol": 0.5, "units": ["°c", "degrees celsius"]}
  assert _holds(spec, "Normal is about 37 °C.")
  assert _holds(spec, "Normal is 36.6 degrees Celsius.")                   # |36.6 − 37| <= 0.5
  assert not _holds(spec, "Normal is 36.4 °C.")                             # outside tolerance
  assert not _holds(spec, "Normal is 37, roughly.")                         # unit required
  assert not _holds(spec, "It is 37 °Cx.")                                  # unit glued to letters
  rate = {"type": "number", "value": 60, "units": ["bpm"]}
  assert _holds(rate, "A resting rate of 60-100 bpm.")                      # the range's unit applies
  assert _holds(rate, "A resting rate of 60 to 100 bpm.")
  relative = {"type": "number", "value": 3e8, "rel_tol": 0.01}
  assert _holds(relative, "about 2.998 × 10^8")
  assert not _holds(relative, "about 2.9 × 10^8")


def test_count_bounds_and_combinators():
  two_sentences = "One fact. Two facts."
  assert _holds({"type": "sentences", "min": 2, "max": 4}, two_sentences)
  assert not _holds({"type": "sentences", "min": 3}, two_sentences)
  assert _holds({"type": "words", "max": 4}, two_sentences)
  assert not _holds({"type": "words", "max": 3}, two_sentences)
  assert _holds({"type": "bullets"}, "- a")                                 # min defaults to 1
  assert not _holds({"type": "bullets", "min": 2}, "- a")
  either = {"type": "any", "checks": [{"type": "number", "value": 37, "units": ["°c"]},
                                      {"type": "number", "value": 98.6, "units": ["°f"]}]}
  assert _holds(either, "98.6 °F") and not _holds(either, "99 °F")
  both = {"type": "all", "checks": [{"type": "number", "value": 60}, {"type": "number", "value": 100}]}
  assert _holds(both, "60-100") and not _holds(both, "60 only")


@pytest.mark.parametrize("spec, where", [
    ({"type": "keyword", "all_of": [["a"]]}, "c.type"),
    ({"type": "keywords"}, "missing key(s) ['all_of']"),
    ({"type": "keywords", "all_of": [["a"]], "same": True}, "unknown key(s) ['same']"),
    ({"type": "keywords", "all_of": [["a"], []]}, "c.all_of[1]"),
    ({"type": "keywords", "all_of": [["a", "b*c"]]}, "c.all_of[0][1]"),
    ({"type": "claim", "any_of": ["x"], "negation_guard": "yes"}, "c.negation_guard"),
    ({"type": "number", "value": "37"}, "c.value"),
    ({"type": "number", "value": 37, "abs_tol": -1}, "c.abs_tol"),
    ({"type": "number", "value": 37, "units": [""]}, "c.units"),
    ({"type": "sentences"}, "give at least one of 'min' and 'max'"),
    ({"type": "words", "min": 5, "max": 2}, "min 5 is larger than max 2"),
    ({"type": "bullets", "min": 1.5}, "c.min"),
    ({"type": "any", "checks": []}, "c.checks"),
    ({"type": "all", "checks": [{"type": "words"}]}, "c.checks[0]"),
])
def test_bad_specs_name_the_key(spec, where):
  with pytest.raises(checks.RubricFormatError) as info:
    checks.parse_check(spec, "c")
  assert where in str(info.value)


# --- the built-in task set ------------------------------------------------------------------


def test_builtin_set_size_ids_and_weights(builtin):
  assert len(builtin) >= 100
  ids = [t.id for t in builtin.tasks]
  assert len(set(ids)) == len(ids)
  num_pitfalls = 0
  for task in builtin.tasks:
    assert task.weights.sum() > 0, task.id         # the paper's Σ ω normaliser is usable
    assert len({c.id for c in task.criteria}) == len(task.criteria)
    num_pitfalls += sum(c.is_pitfall for c in task.criteria)
  assert num_pitfalls >= 30
  kinds = {type(c.check).kind for t in builtin.tasks for c in t.criteria}
  assert {"keywords", "claim", "number", "sentences", "words", "bullets"} <= kinds


def test_builtin_specs_reparse_identically(builtin):
  # Every spec in the data file is valid and round-trips through the parser unchanged.
  with open(tasks.BUILTIN_PATH, encoding="utf-8") as f:
    raw_tasks = [json.loads(line) for line in f if line.strip()]
  assert [t["id"] for t in raw_tasks] == [t.id for t in builtin.tasks]
  for raw, task in zip(raw_tasks, builtin.tasks):
    for i, (raw_criterion, criterion) in enumerate(zip(raw["criteria"], task.criteria)):
      assert checks.parse_check(raw_criterion["check"], f"{task.id}[{i}]") == criterion.check


def test_builtin_references_meet_positive_criteria_and_no_pitfall(builtin):
  for task in builtin.tasks:
    assert task.reference is not None, task.id
    verdicts = tasks.check(task, task.reference)
    expected = (task.weights > 0).astype(np.float32)
    failed = [c.id for c, v, e in zip(task.criteria, verdicts, expected) if v != e]
    assert not failed, f"{task.id}: reference fails {failed}"


def test_builtin_non_answer_meets_no_content_criterion(builtin):
  for task in builtin.tasks:
    verdicts = tasks.check(task, "I do not know.")
    met = [c.id for c, v in zip(task.criteria, verdicts) if v and type(c.check).kind != "words"]
    assert not met, f"{task.id}: a non-answer meets {met}"


@pytest.mark.parametrize("task_id, answer, expected", [
    # scattering, wavelength, violet, 2-4 sentences, ocean pitfall
    ("sky-blue", "The sky is blue because it reflects the ocean. Water is blue.", [0, 0, 0, 1, 1]),
    ("sky-blue", "Air molecules scatter blue light, which has a short wavelength, more than red light.",
     [1, 1, 0, 0, 0]),
    # tilt, angle, hemispheres, 3-5 sentences, distance pitfall
    ("seasons", "Summer happens when Earth is closer to the Sun. Winter happens when it is farther away. "
                "That is all.", [0, 0, 0, 1, 1]),
    ("seasons", "Seasons are not caused by Earth's changing distance from the Sun. They come from the tilt "
                "of Earth's axis. The tilted hemisphere gets more direct light.", [1, 1, 0, 1, 0]),
    # antigen, memory, faster, 3-5 sentences, autism pitfall
    ("vaccines-work", "Vaccines cause autism. They contain toxins. Avoid them.", [0, 0, 0, 1, 1]),
    # bacteria targets, viruses lack them, resistance, 2-4 sentences, "kill viruses" pitfall
    ("antibiotics-viruses", "Antibiotics kill viruses and bacteria alike, so take them for a cold.",
     [0, 0, 0, 0, 1]),
    # 37 °C, 38 °C fever, variation, 2-3 sentences
    ("normal-body-temperature", "Normal is 36 °C. A fever starts at 100.4 °F.", [0, 1, 0, 1]),
    # evaporation, condensation, precipitation, collection, 3-6 bullets
    ("water-cycle", "Water evaporates, condenses into clouds and falls as rain.", [1, 1, 1, 0, 0]),
    # 150 million km, 8.3 minutes, AU, under 60 words
    ("earth-sun-distance", "The Sun is 93 million miles away and light takes 20 minutes. " + "word " * 60,
     [1, 0, 0, 0]),
])
def test_hand_written_answers_fail_the_right_criteria(by_id, task_id, answer, expected):
  np.testing.assert_array_equal(tasks.check(by_id[task_id], answer), np.asarray(expected, np.float32))


def test_check_group_and_task_set_round_trip(builtin, by_id):
  task = by_id["sky-blue"]
  answers = [task.reference, "I do not know."]
  verdicts = tasks.check_group(task, answers)
  assert verdicts.shape == (2, len(task.criteria)) and verdicts.dtype == np.float32
  np.testing.assert_array_equal(verdicts[0], tasks.check(task, answers[0]))
  # A rubric task is its own task (no environment Task stands in for it); its key names it.
  assert task.key == "sky-blue"
  assert {t.key: t for t in builtin.tasks}["sky-blue"] is task
  assert len({t.key for t in builtin.tasks}) == len(builtin)
  with pytest.raises(TypeError, match="must be a str"):
    tasks.check(task, None)


# --- JSONL errors ---------------------------------------------------------------------------


def _valid_task(task_id="t1", **overrides):
  task = {"id": task_id, "prompt": "Why?", "criteria": [
      {"id": "fact", "text": "Mentions a fact.", "weight": 2,
       "check": {"type": "keywords", "all_of": [["fact"]]}}]}
  task.update(overrides)
  return task


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "invalid JSON"),
    (json.dumps([1, 2]), "expected a JSON object"),
    (json.dumps(_valid_task("t2", extra=1)), "unknown key(s) ['extra']"),
    (json.dumps({"id": "t2", "prompt": "Why?"}), "missing key(s) ['criteria']"),
    (json.dumps(_valid_task("t2", prompt="")), ".prompt: expected a non-empty string"),
    (json.dumps(_valid_task("t1")), ".id: duplicate task id 't1' (first defined on line 1)"),
    (json.dumps(_valid_task("t2", criteria=[{**_valid_task()["criteria"][0], "weight": 0}])),
     ".criteria[0].weight: expected a finite non-zero number"),
    (json.dumps(_valid_task("t2", criteria=[{**_valid_task()["criteria"][0], "weight": -1}])),
     "needs at least one positive weight"),
    (json.dumps(_valid_task("t2", criteria=[_valid_task()["criteria"][0]] * 2)),
     ".criteria[1].id: duplicate criterion id 'fact'"),
    (json.dumps(_valid_task("t2", criteria=[{**_valid_task()["criteria"][0],
                                             "check": {"type": "words", "max": -3}}])),
     ".criteria[0].check.max: expected a non-negative integer"),
])
def test_jsonl_errors_name_file_line_and_key(tmp_path, bad_line, message):
  path = tmp_path / "tasks.jsonl"
  path.write_text(json.dumps(_valid_task()) + "\n\n" + bad_line + "\n")
  with pytest.raises(tasks.RubricFormatError) as info:
    tasks.load_jsonl(path)
  assert str(info.value).startswith(f"{path}:3")          # the blank line 2 still counts
  assert message in str(info.value)


def test_jsonl_loads_valid_file_and_rejects_empty_or_missing(tmp_path):
  path = tmp_path / "mine.jsonl"
  path.write_text(json.dumps(_valid_task(reference="A fact.", domain="x")) + "\n")
  task_set = tasks.load_jsonl(path)
  assert task_set.name == "mine" and task_set.tasks[0].reference == "A fact."
  np.testing.assert_array_equal(tasks.check(task_set.tasks[0], "A FACT."), [1.0])
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  with pytest.raises(tasks.RubricFormatError, match="no tasks"):
    tasks.load_jsonl(empty)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    tasks.load_jsonl(tmp_path / "absent.jsonl")
