"""The tiny model's tokenizer reads the teacher's and guidance's text: no `<|unk|>` in any
teacher prompt, guidance hint or CriPO teacher context the real rendering functions produce,
for every built-in environment and vocabulary; and an environment word keeps its id."""
import numpy as np
import pytest

from rised_jax import envs
from rised_jax.model import tiny
from rised_jax.rollout.chat import ChatFormat, join_system_text
from rised_jax.rubrics.vocabulary import BUILTIN_VOCABULARIES, Vocabulary
from rised_jax.teach import GuidanceMemory, cripo_prefix, positive
from rised_jax.types import Group, GroupTags, Task, Trajectory


def _group(env: str, system_prompt: str, observation: str, vocab: Vocabulary, tag_ids):
  """One successful rollout of `env` whose judge gave it `tag_ids`."""
  task = Task(env, 0)
  group = Group(task, [Trajectory(task, [], [], [], 0, [], success=True, reward=1.0)],
                system_prompt=system_prompt, first_observation=observation)
  return group, GroupTags(vocab.multi_hot(tag_ids)[None], np.zeros(1, bool))


def _rendered_prompts(env_name: str, vocab: Vocabulary, tokenizer):
  """(what, ids) of every teacher prompt, hinted prompt and CriPO context for one env."""
  env = envs.make(env_name)
  observation = env.reset(0)
  chat = ChatFormat(tokenizer)
  group, tags = _group(env_name, env.system_prompt, observation, vocab, vocab.positive_ids)
  for context in positive.CONTEXTS:
    prefix, _ = positive.positive_teacher_prefix(env.system_prompt, 0, [group], [tags], vocab,
                                                 context=context)
    yield f"teacher ({context})", positive.teacher_prompt_ids(chat, prefix, observation)
  memory = GuidanceMemory(vocab, threshold=0.0, top_m=len(vocab.negative_ids))
  memory.update(*map(list, zip(_group(env_name, "", "", vocab, vocab.negative_ids))))
  hint = memory.hint(env_name)
  assert hint.count(";") == len(vocab.negative_ids) - 1   # every negative is in the hint
  yield "hint", chat.prompt_ids(join_system_text(env.system_prompt, hint), observation)
  descriptions = [e.description for e in vocab.entries]
  action = env.action_space()[0]
  for render in (cripo_prefix.injection_messages, cripo_prefix.counterfactual_messages):
    messages = render(observation, envs.format_answer(action), descriptions, env.system_prompt)
    yield render.__name__, tokenizer.encode_chat(messages, add_generation_prompt=True)


@pytest.mark.parametrize("vocabulary", BUILTIN_VOCABULARIES)
@pytest.mark.parametrize("env_name", envs.names())
def test_no_unknown_token_in_teacher_hint_or_cripo_text(env_name, vocabulary):
  tokenizer = tiny.build_tokenizer(tiny.tokenizer_words([env_name]))
  unk = tokenizer.hf_tokenizer.convert_tokens_to_ids("<|unk|>")
  vocab = Vocabulary.load(vocabulary)
  for what, ids in _rendered_prompts(env_name, vocab, tokenizer):
    unknown = [i for i, t in enumerate(ids) if t == unk]
    assert not unknown, (f"{env_name}/{what}: {len(unknown)} of {len(ids)} tokens unknown in "
                         f"{tokenizer.decode(ids)!r}")


def test_without_rubric_words_the_teacher_block_is_mostly_unknown():
  """The counter-check: the environments' words alone leave most of the block unknown (the
  maze tokenizer's count before rubric words were added)."""
  tokenizer = tiny.build_tokenizer(tiny.tokenizer_words(["maze"], rubric=False))
  unk = tokenizer.hf_tokenizer.convert_tokens_to_ids("<|unk|>")
  block = "Behaviours that succeed here:\n- Uses valid action syntax on every turn"
  ids = tokenizer.encode(block)
  # Known from maze's own words: "that", "here", ":", "-", "action", "on", "every"? Counted by
  # hand against environment_words(["maze"]).
  words = tiny.WORD.findall(block)
  maze_words = set(tiny.environment_words(["maze"]))
  assert len(ids) == len(words)
  assert [t == unk for t in ids] == [w not in maze_words for w in words]
  assert sum(t == unk for t in ids) > len(ids) / 2


@pytest.mark.parametrize("env_names", [["frozenlake"], ["frozenlake", "maze"]])
def test_rubric_words_come_after_the_environment_words(env_names):
  """Environment words keep the ids they have without rubric words (the learning setting's
  tokens do not move); every rubric word is in the tokenizer, once."""
  plain = tiny.build_tokenizer(tiny.tokenizer_words(env_names, rubric=False)).hf_tokenizer.get_vocab()
  full = tiny.build_tokenizer(tiny.tokenizer_words(env_names)).hf_tokenizer.get_vocab()
  assert {w: full[w] for w in plain} == plain
  assert set(tiny.rubric_words()) <= set(full)
  assert sorted(full.values()) == list(range(len(full)))
  assert min(full[w] for w in set(full) - set(plain)) == len(plain)
