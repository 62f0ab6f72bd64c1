"""The agent loop's token-exact transcripts, masks and budgets, and the chat segments.

References are written out by hand (ChatML and Gemma-style texts), replayed on fresh
environments, or recomputed by a full (cache-free) forward pass of the model.
"""
import copy
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest
from flax import nnx

from tests.helpers import model_utils as mu
from rised_jax.model import ModelConfig, Tokenizer
from rised_jax.rollout.agent_loop import AgentLoop, EnvironmentFailure, make_env, sampling_seed
from rised_jax.rollout.base import GenerationRequest, GenerationResult, SamplingParams
from rised_jax.rollout.chat import ChatFormat
from rised_jax.rollout.jax_engine import JaxEngine
from rised_jax.types import Task
from tests.helpers.fake_engine import FakeEngine

RUN_SEED = 11
IM_END = 2                                          # SmolLM2's "<|im_end|>" (its EOS)
SAMPLING = SamplingParams(max_new_tokens=1, temperature=1.0)
FORWARD = nnx.jit(lambda model, ids, mask: model(ids, mask))
GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set prefix = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{{ (prefix if loop.first else '') + (m['content'] | trim) }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer(smollm2):
  return smollm2[1]


@pytest.fixture(scope="module")
def gemma_style(tokenizer):
  """SmolLM2's vocabulary plus Gemma's turn tokens, with a Gemma-3-style template."""
  hf = copy.deepcopy(tokenizer.hf_tokenizer)
  hf.add_tokens(["<start_of_turn>", "<end_of_turn>"], special_tokens=True)
  return Tokenizer(hf, GEMMA_STYLE_TEMPLATE)


def chatml_prompt(tok, system, user):
  return tok.encode(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}"
                    f"<|im_end|>\n<|im_start|>assistant\n")


def chatml_observation(tok, observation):
  return tok.encode(f"\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n")


# ------------------------------------------------------------------ chat segments


def test_chatml_segments_of_smollm2(tokenizer):
  chat = ChatFormat(tokenizer)
  assert chat.end_of_turn_text == "<|im_end|>" and chat.end_of_turn_ids == (IM_END,)
  assert chat.observation_text("OBS") == \
      "\n<|im_start|>user\nOBS<|im_end|>\n<|im_start|>assistant\n"
  assert chat.prompt_ids("Sys.", "Obs 1.") == chatml_prompt(tokenizer, "Sys.", "Obs 1.")


def test_gemma_style_segments(gemma_style):
  chat = ChatFormat(gemma_style)
  end = gemma_style.encode("<end_of_turn>")
  assert chat.end_of_turn_text == "<end_of_turn>" and list(chat.end_of_turn_ids) == end
  assert len(end) == 1 and end[0] in gemma_style.stop_token_ids
  # The template trims message content; the segment keeps that.
  assert chat.observation_text("  OBS \n") == \
      "\n<start_of_turn>user\nOBS<end_of_turn>\n<start_of_turn>model\n"
  bos = gemma_style.hf_tokenizer.bos_token
  assert gemma_style.decode(chat.prompt_ids("Sys.", "Obs 1.")) == \
      f"{bos}<start_of_turn>user\nSys.\n\nObs 1.<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.parametrize("which", ["smollm2", "gemma_style"])
def test_concatenated_segments_spell_the_template_rendering(which, request):
  tok = request.getfixturevalue("tokenizer" if which == "smollm2" else which)
  chat = ChatFormat(tok)
  observations, replies = ["Obs 1.", "Obs 2: wall.", "Obs 3."], ["Go <answer>up</answer>", "ok"]
  ids = chat.prompt_ids("Be brief.", observations[0])
  for reply, observation in zip(replies, observations[1:]):
    ids += tok.encode(reply) + list(chat.end_of_turn_ids) + chat.observation_ids(observation)
  messages = [{"role": "system", "content": "Be brief."}]
  for i, observation in enumerate(observations):
    messages.append({"role": "user", "content": observation})
    if i < len(replies):
      messages.append({"role": "assistant", "content": replies[i]})
  assert tok.decode(ids) == tok.render_chat(messages, add_generation_prompt=True)


def test_template_that_does_not_end_turns_with_a_stop_token_is_refused(tokenizer):
  odd = Tokenizer(copy.deepcopy(tokenizer.hf_tokenizer),
                  "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} [/turn]\n"
                  "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")
  with pytest.raises(ValueError, match="stop token"):
    ChatFormat(odd)


# ------------------------------------------------------------------ scripted engine


class ScriptedEngine(FakeEngine):
  """Replies with the ids scripted for each request's seed (cut to its max_new_tokens);
  log-prob k of a reply is -(k + 1) / 100. Records every request."""

  def __init__(self, replies):
    super().__init__()
    self.replies = replies

  def reply(self, request, call):
    ids = self.replies[request.seed][:request.params.max_new_tokens]
    stopped = ids[-1] in request.params.stop_token_ids
    return GenerationResult(list(ids), [-(k + 1) / 100 for k in range(len(ids))],
                            "stop" if stopped else "length")


def split_answer_ids(tok, action):
  """'<answer>ACTION</answer>' with "answer" spelt as the two tokens "an" + "swer", which
  re-encoding merges into one: a decode→encode round trip changes these ids."""
  word = tok.encode("an") + tok.encode("swer")
  return tok.encode("<") + word + tok.encode(f">{action}</") + word + tok.encode(">")


TASKS = [Task("maze", 0, {"max_turns": 5}), Task("countdown", 3)]


def scripted_replies(tok, tasks, group_size, max_turns=20):
  """Rollout 0 plays the oracle's plan (with the eot token); rollout 1 sends invalid actions,
  its first reply cut without the eot token."""
  replies = {}
  for task in tasks:
    plan = make_env(task)
    plan.reset(task.seed)
    plan = plan.oracle()
    for rollout in range(group_size):
      for turn in range(max_turns):
        if rollout == 0:
          ids = tok.encode("Plan: ") + split_answer_ids(tok, plan[min(turn, len(plan) - 1)])
        else:
          ids = tok.encode("Hmm ") + split_answer_ids(tok, "fly away")
        replies[sampling_seed(RUN_SEED, task, rollout, turn)] = \
            ids + ([] if rollout and turn == 0 else [IM_END])
  return replies


def expected_transcript(tok, trajectory, system_text):
  """Hand-written ChatML prompt + each reply + closing eot when absent + observation."""
  replies = split_by_mask(trajectory)
  ids = chatml_prompt(tok, system_text, first_observation(trajectory.task))
  for i, (reply, turn) in enumerate(zip(replies, trajectory.turns)):
    ids += reply
    if i < len(replies) - 1:
      ids += ([] if reply[-1] == IM_END else [IM_END]) + chatml_observation(tok, turn.observation)
  return ids


def split_by_mask(trajectory):
  """The agent replies: maximal runs of loss_mask == 1."""
  replies, current = [], []
  for token, m in zip(trajectory.token_ids, trajectory.loss_mask):
    if m:
      current.append(token)
    elif current:
      replies, current = replies + [current], []
  return replies + ([current] if current else [])


def first_observation(task):
  return make_env(task).reset(task.seed)


@pytest.fixture(scope="module")
def scripted_run(tokenizer):
  engine = ScriptedEngine(scripted_replies(tokenizer, TASKS, 2))
  loop = AgentLoop(engine, tokenizer, max_new_tokens_per_turn=64, max_total_tokens=4096,
                   sampling=SAMPLING)
  run = loop.run(TASKS, group_size=2, hints={"maze": "Avoid: bumping into walls."},
                 seed=RUN_SEED)
  return loop, engine, run.groups


def test_transcripts_keep_the_generated_ids(tokenizer, scripted_run):
  loop, _, groups = scripted_run
  assert [g.task for g in groups] == TASKS and all(len(g.trajectories) == 2 for g in groups)
  for group in groups:
    env = make_env(group.task)
    system = env.system_prompt + ("\n\nAvoid: bumping into walls." if group.task.env == "maze"
                                  else "")
    for trajectory in group.trajectories:
      assert trajectory.token_ids == expected_transcript(tokenizer, trajectory, system)
      for reply in split_by_mask(trajectory):
        text = tokenizer.decode(reply)
        assert tokenizer.encode(text) != reply     # re-tokenising would have changed them
        assert re.search(r"<answer>[^<]+</answer>", text)


def test_masks_and_logprobs_cover_exactly_the_agent_tokens(tokenizer, scripted_run):
  _, _, groups = scripted_run
  for trajectory in (t for g in groups for t in g.trajectories):
    n = len(trajectory.token_ids)
    assert len(trajectory.loss_mask) == len(trajectory.behaviour_logprobs) == n
    replies = split_by_mask(trajectory)
    assert len(replies) == len(trajectory.turns)
    assert trajectory.num_agent_tokens == sum(len(r) for r in replies)
    assert trajectory.loss_mask[:trajectory.prompt_len] == [0] * trajectory.prompt_len
    assert trajectory.loss_mask[trajectory.prompt_len] == 1
    # The scripted log-probs, -(k + 1) / 100 for the k-th id of each reply, 0 elsewhere.
    expected, k = [], 0
    for m in trajectory.loss_mask:
      k = k + 1 if m else 0
      expected.append(-k / 100 if m else 0.0)
    np.testing.assert_allclose(trajectory.behaviour_logprobs, expected)


def test_outcomes_replay_on_fresh_environments(tokenizer, scripted_run):
  _, _, groups = scripted_run
  for group in groups:
    solver, idler = group.trajectories
    assert solver.success and solver.reward == 1.0 and not solver.truncated
    assert not idler.success and idler.truncated and idler.reward == 0.0
    assert len(idler.turns) == make_env(group.task).max_turns
    assert all(turn.invalid and "invalid_action" in turn.events for turn in idler.turns)
    for trajectory in group.trajectories:
      env = make_env(group.task)
      env.reset(group.task.seed)
      for turn in trajectory.turns:
        observation, reward, done, info = env.step(turn.action_text)
        assert (observation, reward, done, info["events"]) == \
            (turn.observation, turn.reward, turn.done, turn.events)
  # The idler's first reply was cut (no eot): the loop closed the turn with a non-agent eot.
  idler = groups[1].trajectories[1]
  first = split_by_mask(idler)[0]
  end = idler.prompt_len + len(first)
  assert first[-1] != IM_END and idler.token_ids[end] == IM_END and idler.loss_mask[end] == 0


def test_requests_see_the_transcript_so_far(tokenizer, scripted_run):
  _, engine, groups = scripted_run
  by_seed = {r.seed: r for r in engine.requests}
  assert len(by_seed) == len(engine.requests)       # every (rollout, turn) has its own seed
  for group in groups:
    for rollout, trajectory in enumerate(group.trajectories):
      replies = split_by_mask(trajectory)
      position = trajectory.prompt_len
      for turn, reply in enumerate(replies):
        request = by_seed[sampling_seed(RUN_SEED, group.task, rollout, turn)]
        start = trajectory.token_ids.index(reply[0], position)
        assert list(request.prompt_ids) == trajectory.token_ids[:start]
        assert request.params.max_new_tokens == 64
        assert IM_END in request.params.stop_token_ids
        position = start + len(reply)


def test_hint_only_in_the_prompt_of_its_environment(tokenizer, scripted_run):
  loop, _, groups = scripted_run
  hint = "Avoid: bumping into walls."
  for group in groups:
    for trajectory in group.trajectories:
      prompt = tokenizer.decode(trajectory.token_ids[:trajectory.prompt_len])
      with_hint = group.task.env == "maze"
      assert (hint in prompt) == with_hint and trajectory.hint == (hint if with_hint else "")
      assert trajectory.token_ids[:trajectory.prompt_len] == \
          loop.prompt_ids(group.task, trajectory.hint)
      assert hint not in tokenizer.decode(loop.prompt_ids(group.task))
  # Without hints no prompt has one.
  engine = ScriptedEngine(scripted_replies(tokenizer, TASKS[:1], 1))
  plain = AgentLoop(engine, tokenizer, max_new_tokens_per_turn=64, max_total_tokens=4096,
                    sampling=SAMPLING).run(TASKS[:1], 1, seed=RUN_SEED).groups[0].trajectories[0]
  assert plain.token_ids[:plain.prompt_len] == loop.prompt_ids(TASKS[0])
  assert plain.hint == "" and hint not in tokenizer.decode(plain.token_ids)


def test_reply_prefix_is_context_and_stop_strings_cut_replies(tokenizer):
  # Replies continue a forced "<answer>": the oracle's action, "</answer>", then chatter and
  # the eot that a stop string must cut off; the environment reads prefix + kept reply.
  task = Task("maze", 0, {"max_turns": 5})
  plan = make_env(task)
  plan.reset(task.seed)
  plan = plan.oracle()
  kept, tail = {}, tokenizer.encode(" and then more words") + [IM_END]
  for turn in range(len(plan)):
    kept[sampling_seed(RUN_SEED, task, 0, turn)] = tokenizer.encode(f"{plan[turn]}</") + \
        tokenizer.encode("answer>")
  engine = ScriptedEngine({seed: ids + tail for seed, ids in kept.items()})
  loop = AgentLoop(engine, tokenizer, max_new_tokens_per_turn=64, max_total_tokens=4096,
                   sampling=SAMPLING, reply_prefix="<answer>", stop_strings=["</answer>"])
  trajectory = loop.run([task], 1, seed=RUN_SEED).groups[0].trajectories[0]
  assert trajectory.success and len(trajectory.turns) == len(plan)
  assert [t.action_text for t in trajectory.turns] == [f"<answer>{a}</answer>" for a in plan]
  # By hand: prompt, then per turn the forced prefix, the reply up to "</answer>", the eot the
  # loop adds (the reply lost its own), the observation.
  prefix = tokenizer.encode("<answer>")
  ids = chatml_prompt(tokenizer, make_env(task).system_prompt, first_observation(task)) + prefix
  mask = [0] * len(ids)
  logprobs = [0.0] * len(ids)
  for turn, action_turn in enumerate(trajectory.turns):
    reply = kept[sampling_seed(RUN_SEED, task, 0, turn)]
    ids += reply
    mask += [1] * len(reply)
    logprobs += [-(k + 1) / 100 for k in range(len(reply))]
    if turn < len(plan) - 1:
      segment = [IM_END] + chatml_observation(tokenizer, action_turn.observation) + prefix
      ids += segment
      mask += [0] * len(segment)
      logprobs += [0.0] * len(segment)
  assert trajectory.token_ids == ids and trajectory.loss_mask == mask
  np.testing.assert_allclose(trajectory.behaviour_logprobs, logprobs)
  # Every request ended with the prefix; teacher and student rows built from prompt_ids too.
  assert all(list(r.prompt_ids[-len(prefix):]) == prefix for r in engine.requests)
  assert trajectory.token_ids[:trajectory.prompt_len] == loop.prompt_ids(task)
  with pytest.raises(ValueError, match="stop_strings"):
    AgentLoop(engine, tokenizer, max_new_tokens_per_turn=8, max_total_tokens=512,
              sampling=SAMPLING, stop_strings="</answer>")


def test_turn_budget_truncates_as_failure(tokenizer):
  task = Task("countdown", 3)
  engine = ScriptedEngine(scripted_replies(tokenizer, [task], 2))
  loop = AgentLoop(engine, tokenizer, max_turns=1, max_new_tokens_per_turn=64,
                   max_total_tokens=4096, sampling=SAMPLING)
  solver, idler = loop.run([task], 2, seed=RUN_SEED).groups[0].trajectories
  for trajectory in (solver, idler):   # the oracle needs 2 turns: one is not enough
    assert len(trajectory.turns) == 1 and trajectory.truncated and not trajectory.success
    # Nothing after the last reply: the ids end with the agent's tokens.
    assert trajectory.loss_mask[-1] == 1


def test_token_budget_truncates_as_failure(tokenizer):
  task = Task("countdown", 3)
  replies = scripted_replies(tokenizer, [task], 1)
  first_reply = replies[sampling_seed(RUN_SEED, task, 0, 0)]
  prompt_len = len(ChatFormat(tokenizer).prompt_ids(make_env(task).system_prompt,
                                                    first_observation(task)))
  env = make_env(task)
  env.reset(task.seed)
  observation = env.step(tokenizer.decode(first_reply, skip_special_tokens=True))[0]
  room_left = 5
  budget = prompt_len + len(first_reply) + len(chatml_observation(tokenizer, observation)) + \
      room_left
  engine = ScriptedEngine(replies)
  loop = AgentLoop(engine, tokenizer, max_new_tokens_per_turn=64, max_total_tokens=budget,
                   sampling=SAMPLING)
  trajectory = loop.run([task], 1, seed=RUN_SEED).groups[0].trajectories[0]
  assert [r.params.max_new_tokens for r in engine.requests] == [64, room_left]
  assert len(trajectory.turns) == 2 and trajectory.truncated and not trajectory.success
  assert len(trajectory.token_ids) == budget
  assert split_by_mask(trajectory)[1] == replies[sampling_seed(RUN_SEED, task, 0, 1)][:room_left]


def test_prompt_over_the_token_budget_is_an_error(tokenizer):
  # An environment error of its group (issue 23; tests/rollout/test_loop_faults.py): with no
  # other group left, the run is a clear error naming the task and the budget.
  loop = AgentLoop(ScriptedEngine({}), tokenizer, max_new_tokens_per_turn=8,
                   max_total_tokens=50, sampling=SAMPLING)
  with pytest.raises(EnvironmentFailure, match=r"task countdown:3 rollout 0, reset: ValueError: "
                                               r"the prompt .*max_total_tokens=50"):
    loop.run([Task("countdown", 3)], 1)


def test_bad_arguments_are_errors(tokenizer):
  with pytest.raises(ValueError, match="max_total_tokens"):
    AgentLoop(ScriptedEngine({}), tokenizer, max_new_tokens_per_turn=8, max_total_tokens=0,
              sampling=SAMPLING)
  loop = AgentLoop(ScriptedEngine({}), tokenizer, max_new_tokens_per_turn=8,
                   max_total_tokens=512, sampling=SAMPLING)
  with pytest.raises(ValueError,
                     match=r"^config\.envs\.names: unknown environment 'chess'; known: "):
    loop.run([Task("chess", 0)], 1)
  with pytest.raises(ValueError, match="group_size"):
    loop.run(TASKS, 0)


def test_limits_beyond_the_engine_buckets_are_errors(tokenizer):
  model = mu.random_decoder(ModelConfig.from_hf(mu.tiny_config("llama_gqa_tied")))
  engine = JaxEngine(model, prompt_buckets=(256,), max_new_tokens_buckets=(16,))
  with pytest.raises(ValueError, match="largest prompt bucket is 256"):
    AgentLoop(engine, tokenizer, max_new_tokens_per_turn=16, max_total_tokens=258,
              sampling=SAMPLING)
  with pytest.raises(ValueError, match="largest new-token bucket 16"):
    AgentLoop(engine, tokenizer, max_new_tokens_per_turn=17, max_total_tokens=257,
              sampling=SAMPLING)
  assert engine.compile_counts == {}


# ------------------------------------------------------------------ with real engines


def teacher_forced_agent_logprobs(model, trajectory, width):
  """log π(token_t | tokens before t) at the agent positions, from one full forward."""
  ids, mask = mu.padded_batch([trajectory.token_ids], "right", width=width)
  logits = np.asarray(FORWARD(model, ids, mask)[0], np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
  positions = np.flatnonzero(trajectory.loss_mask)
  return np.array([logp[p - 1, trajectory.token_ids[p]] for p in positions])


def check_rollouts(model, tokenizer, groups, width, atol, per_turn):
  stops = set(tokenizer.stop_token_ids)
  for trajectory in (t for g in groups for t in g.trajectories):
    assert len(trajectory.token_ids) <= width
    system = make_env(trajectory.task).system_prompt
    assert trajectory.token_ids == expected_transcript(tokenizer, trajectory, system)
    for reply in split_by_mask(trajectory):
      assert reply[-1] in stops or len(reply) == per_turn
      assert all(t not in stops for t in reply[:-1])
    agent = np.asarray(trajectory.behaviour_logprobs)[np.flatnonzero(trajectory.loss_mask)]
    np.testing.assert_allclose(agent, teacher_forced_agent_logprobs(model, trajectory, width),
                               atol=atol)


@pytest.mark.slow
def test_jax_engine_multi_environment_run(tokenizer):
  cfg = ModelConfig.from_hf(mu.tiny_config("llama_gqa_tied", vocab_size=tokenizer.vocab_size,
                                           max_position_embeddings=1024))
  model = mu.random_decoder(cfg, seed=3)
  engine = JaxEngine(model, max_batch=8, prompt_buckets=(512,), max_new_tokens_buckets=(8,))
  loop = AgentLoop(engine, tokenizer, max_turns=2, max_new_tokens_per_turn=8,
                   max_total_tokens=512, sampling=SamplingParams(max_new_tokens=8, top_k=50))
  tasks = [Task("maze", 1), Task("countdown", 2), Task("sokoban", 3)]
  groups = loop.run(tasks, group_size=2, seed=5).groups
  assert [len(g.trajectories) for g in groups] == [2, 2, 2]
  check_rollouts(model, tokenizer, groups, 512, atol=1e-4, per_turn=8)
  # Same seed, same rollouts; the two rollouts of a group differ.
  again = loop.run(tasks, group_size=2, seed=5).groups
  assert [[t.token_ids for t in g.trajectories] for g in again] == \
      [[t.token_ids for t in g.trajectories] for g in groups]
  assert all(g.trajectories[0].token_ids != g.trajectories[1].token_ids for g in groups)
  # Prefill, decode, and the first turn's shared-prompt prefill (3 distinct prompts of the 6
  # rows go through the model as a batch of 4).
  assert set(engine.compile_counts.values()) == {1} and len(engine.compile_counts) == 3
  assert sum(b.distinct == 4 for _, b in engine.compile_counts) == 1


@pytest.mark.slow
def test_prefix_reuse_gives_the_same_rollouts(tokenizer):
  # With JaxEngine's prefix reuse each turn prefills only what the environment added; the
  # rollouts are those of full prefills, and a second run (the kept caches reset at its
  # start) repeats the first exactly.
  cfg = ModelConfig.from_hf(mu.tiny_config("llama_gqa_tied", vocab_size=tokenizer.vocab_size,
                                           max_position_embeddings=1024))
  model = mu.random_decoder(cfg, seed=3)
  runs = []
  for reuse in (False, True, True):
    engine = JaxEngine(model, max_batch=8, prompt_buckets=(512,), max_new_tokens_buckets=(8,),
                       reuse_prefix=reuse)
    loop = AgentLoop(engine, tokenizer, max_turns=3, max_new_tokens_per_turn=8,
                     max_total_tokens=512, sampling=SamplingParams(max_new_tokens=8, top_k=50))
    groups = loop.run([Task("maze", 1), Task("countdown", 2)], group_size=2, seed=5).groups
    assert (engine.last_reused_tokens > 0) == reuse
    runs.append([t for g in groups for t in g.trajectories])
  plain, reused, again = runs
  assert [t.token_ids for t in reused] == [t.token_ids for t in plain]
  for a, b in zip(reused, plain):
    np.testing.assert_allclose(a.behaviour_logprobs, b.behaviour_logprobs, atol=1e-5)
  assert [(t.token_ids, t.behaviour_logprobs) for t in again] == \
      [(t.token_ids, t.behaviour_logprobs) for t in reused]


@pytest.mark.slow
def test_packaged_smollm2_end_to_end(smollm2):
  model, tokenizer = smollm2
  engine = JaxEngine(model, max_batch=4, prompt_buckets=(512,), max_new_tokens_buckets=(32,))
  loop = AgentLoop(engine, tokenizer, max_turns=2, max_new_tokens_per_turn=32,
                   max_total_tokens=512, sampling=SamplingParams(max_new_tokens=32))
  groups = loop.run([Task("wordle", 0), Task("frozenlake", 2)], group_size=2, seed=1).groups
  check_rollouts(model, tokenizer, groups, 512, atol=2e-3, per_turn=32)
  for trajectory in (t for g in groups for t in g.trajectories):
    assert 1 <= len(trajectory.turns) <= 2
    if not trajectory.turns[-1].done:      # the loop's turn budget ended it
      assert len(trajectory.turns) == 2 and trajectory.truncated and not trajectory.success
