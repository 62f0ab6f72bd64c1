"""SGLangEngine against a real SGLang-API server (sglang-jax 0.1.0rc0 on CPU).

A tiny random Qwen3 is exported with rised_jax's own exporter, served by
experiments/sglang/launch_server.sh, and queried through the client; the server's tokens and
log-probs are checked against the same model run in-process (rised_jax.model.Decoder).

Needs the server's virtual environment: experiments/sglang/setup_sglang_jax.sh. Without it the
module is skipped, or fails when the CI environment variable is set.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import time

import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
import transformers
from tokenizers import models, pre_tokenizers

from rised_jax import model as rised_model
from rised_jax.rollout.base import GenerationRequest, SamplingParams
from rised_jax.rollout.sglang_engine import SGLangEngine, SGLangError
from tests.helpers.ports import free_port

# Starting the server and compiling its shapes takes 40-110 s on 2 CPU cores.
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVER_PYTHON = REPO / ".venv-sgljax" / "bin" / "python"
LAUNCH_SCRIPT = REPO / "experiments" / "sglang" / "launch_server.sh"
SETUP_HINT = ("run experiments/sglang/setup_sglang_jax.sh to create .venv-sgljax "
              "(sglang-jax 0.1.0rc0, ~2.5 min, ~1.8 GB)")
STARTUP_TIMEOUT_S = 90.0   # ~25 s seen on a loaded 2-core machine
LOGPROB_TOLERANCE = 1e-3

NUM_WORDS = 250
# A tiny Qwen3 the CPU server accepts: sglang-jax's CPU attention needs head_dim % 128 == 0.
# A large initializer_range makes next-token distributions peaked, so greedy has no near-ties;
# a non-default rope_theta checks that the server reads the exported RoPE base.
HF_CONFIG = {
    "model_type": "qwen3", "vocab_size": NUM_WORDS + 3, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 128, "rope_theta": 1_000_000.0,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "initializer_range": 0.25, "eos_token_id": 1,
}


def build_tokenizer() -> rised_model.Tokenizer:
  """A word-level tokenizer: <unk>=0, <|endoftext|>=1, <|im_end|>=2, then w0 … w249."""
  vocab = {"<unk>": 0, "<|endoftext|>": 1, "<|im_end|>": 2}
  vocab.update({f"w{i}": i + 3 for i in range(NUM_WORDS)})
  backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  hf_tokenizer = transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, unk_token="<unk>", eos_token="<|endoftext|>",
      additional_special_tokens=["<|im_end|>"])
  return rised_model.Tokenizer(hf_tokenizer)



@dataclasses.dataclass
class Served:
  model: rised_model.Decoder
  tokenizer: rised_model.Tokenizer
  checkpoint: pathlib.Path
  engine: SGLangEngine
  startup_s: float


def _stop_server(process: subprocess.Popen) -> None:
  """SIGTERM to the server's process group (it forks a scheduler and a detokenizer), then
  SIGKILL if it lingers."""
  if process.poll() is not None:
    return
  os.killpg(process.pid, signal.SIGTERM)
  try:
    process.wait(timeout=20)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  if not SERVER_PYTHON.exists():
    message = f"no sglang-jax server environment at {SERVER_PYTHON.parent.parent}: {SETUP_HINT}"
    if os.environ.get("CI"):
      pytest.fail(message)
    pytest.skip(message)
  tmp = tmp_path_factory.mktemp("sglang_real")
  tokenizer = build_tokenizer()
  cfg = rised_model.ModelConfig.from_hf(HF_CONFIG, source="test_sglang_real.HF_CONFIG")
  model = rised_model.from_config(cfg, seed=0)
  checkpoint = tmp / "checkpoint"
  rised_model.save_pretrained(model, tokenizer, checkpoint, dtype="float32")

  port = free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # no fake devices there
  env["TMPDIR"] = str(tmp)   # the server's IPC sockets
  log_path = tmp / "server.log"
  started = time.monotonic()
  # Compiling only the shapes the tests use is ~3x faster here than the server's full
  # precompile (which made startup take 70-90 s on a loaded 2-core machine).
  command = [str(LAUNCH_SCRIPT), str(checkpoint), str(port), "--disable-precompile",
             "--skip-server-warmup"]
  with open(log_path, "w") as log:
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
  engine = SGLangEngine(f"http://127.0.0.1:{port}", timeout_s=120.0, max_retries=1,
                        backoff_s=0.5, weight_dir=str(tmp / "weights"), tokenizer=tokenizer)
  try:
    while not engine.health():
      if process.poll() is not None or time.monotonic() - started > STARTUP_TIMEOUT_S:
        tail = log_path.read_text()[-3000:]
        state = (f"exited with {process.returncode}" if process.poll() is not None
                 else f"not healthy after {STARTUP_TIMEOUT_S:g} s")
        pytest.fail(f"sglang-jax server {state}; log {log_path} ends:\n{tail}")
      time.sleep(0.5)
    yield Served(model, tokenizer, checkpoint, engine, time.monotonic() - started)
  finally:
    engine.close()
    _stop_server(process)


def model_logits(model: rised_model.Decoder, prompt: list[int], output: list[int]) -> np.ndarray:
  """Our model's logits at the positions that predict each output token: [len(output), V]."""
  ids = jnp.asarray([list(prompt) + list(output)], jnp.int32)
  logits = np.asarray(model(ids)[0], np.float64)
  return logits[len(prompt) - 1:len(prompt) - 1 + len(output)]


def log_softmax(x: np.ndarray) -> np.ndarray:
  shifted = x - x.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def token_logprobs(logits: np.ndarray, output: list[int], temperature: float = 1.0) -> np.ndarray:
  return log_softmax(logits / temperature)[np.arange(len(output)), output]


PROMPTS = [[3, 17, 250, 9, 44], [100], list(range(5, 45))]


def test_server_started_within_timeout(served):
  print(f"sglang-jax server healthy after {served.startup_s:.1f} s")
  assert served.engine.health()


def test_greedy_tokens_and_logprobs_match_our_model(served):
  stops = served.tokenizer.stop_token_ids
  requests = [GenerationRequest(prompt_ids=prompt,
                                params=SamplingParams(max_new_tokens=n, temperature=0.0,
                                                      stop_token_ids=stops))
              for prompt, n in zip(PROMPTS, (12, 16, 60))]   # 60: past sglang-jax's snapshot quirk
  results = served.engine.generate(requests)
  worst = 0.0
  for request, result in zip(requests, results):
    output = result.output_ids
    logits = model_logits(served.model, list(request.prompt_ids), output)
    # Teacher-forced argmax at every step = our model's greedy continuation of this prompt.
    assert output == logits.argmax(axis=-1).tolist()
    hit_stop = [i for i, t in enumerate(output) if t in stops]
    if result.finish_reason == "stop":
      assert hit_stop == [len(output) - 1]
    else:
      assert (result.finish_reason, hit_stop) == ("length", [])
      assert len(output) == request.params.max_new_tokens
    error = np.abs(np.asarray(result.logprobs) - token_logprobs(logits, output)).max()
    worst = max(worst, float(error))
  print(f"greedy: {sum(len(r.output_ids) for r in results)} tokens, max |Δ logprob| = {worst:.2e}")
  assert worst < LOGPROB_TOLERANCE

  # A stop id that greedy emits at step 4 (and not before): generation ends there, the stop
  # token kept and its log-prob returned.
  first = results[0].output_ids
  stop = next(t for i, t in enumerate(first) if i >= 3 and t not in first[:i])
  cut = first.index(stop) + 1
  params = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=stops + (stop,))
  (stopped,) = served.engine.generate([GenerationRequest(PROMPTS[0], params)])
  assert (stopped.output_ids, stopped.finish_reason) == (first[:cut], "stop")
  np.testing.assert_allclose(stopped.logprobs, results[0].logprobs[:cut], rtol=0,
                             atol=LOGPROB_TOLERANCE)


def test_batched_requests_equal_one_at_a_time(served):
  # Requests the server batches together (repeats included, so the radix cache is hit inside
  # one batch) must give what each gives alone. With sglang-jax's overlap scheduler on, this
  # failed on 2 of 7 server starts on CPU (a race); launch_server.sh disables it.
  params = SamplingParams(max_new_tokens=8, temperature=0.0)
  alone = [served.engine.generate([GenerationRequest(prompt, params)])[0] for prompt in PROMPTS]
  served.engine.flush_cache()
  order = (2, 0, 1, 2, 0, 1)
  batched = served.engine.generate([GenerationRequest(PROMPTS[i], params) for i in order])
  assert [r.output_ids for r in batched] == [alone[i].output_ids for i in order]
  for result, i in zip(batched, order):
    np.testing.assert_allclose(result.logprobs, alone[i].logprobs, rtol=0,
                               atol=LOGPROB_TOLERANCE)


def test_sampled_tokens_are_seeded_in_vocab_and_scored_like_our_model(served):
  vocab = served.model.cfg.vocab_size
  params = SamplingParams(max_new_tokens=10, temperature=1.0)
  requests = [GenerationRequest(prompt_ids=PROMPTS[0], params=params, seed=seed)
              for seed in (1, 2, 3, 1)]
  results = served.engine.generate(requests)
  assert results[0].output_ids == results[3].output_ids   # the same seed, the same sample
  assert len({tuple(r.output_ids) for r in results[:3]}) > 1
  for result in results:
    assert all(0 <= t < vocab for t in result.output_ids)
    logits = model_logits(served.model, PROMPTS[0], result.output_ids)
    np.testing.assert_allclose(result.logprobs, token_logprobs(logits, result.output_ids),
                               rtol=0, atol=LOGPROB_TOLERANCE)


def test_top_k_and_temperature_reach_the_server(served):
  # Tokens must come from our model's top 3; log-probs are of the temperature-scaled
  # distribution before truncation (see the client's module docstring).
  params = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=3)
  (result,) = served.engine.generate([GenerationRequest(PROMPTS[2], params, seed=5)])
  logits = model_logits(served.model, PROMPTS[2], result.output_ids)
  top3 = np.argsort(-logits, axis=-1)[:, :3]
  assert all(t in row for t, row in zip(result.output_ids, top3))
  np.testing.assert_allclose(result.logprobs, token_logprobs(logits, result.output_ids, 0.7),
                             rtol=0, atol=LOGPROB_TOLERANCE)


def test_flush_cache_and_model_info(served):
  served.engine.flush_cache()
  info = served.engine.model_info()
  assert pathlib.Path(info["model_path"]) == served.checkpoint
  assert info["is_generation"] is True


def test_weight_sync_reports_the_missing_endpoint(served):
  with pytest.raises(SGLangError, match=r"no POST /update_weights_from_disk \(HTTP 404\)"):
    served.engine.update_weights(served.model, version=1)
  exported = pathlib.Path(served.engine.weight_dir) / "v1"
  reloaded, _ = rised_model.from_pretrained(exported)
  ids = jnp.asarray([PROMPTS[0]], jnp.int32)
  np.testing.assert_array_equal(np.asarray(reloaded(ids)), np.asarray(served.model(ids)))
  # Later calls fail at once, without exporting again.
  with pytest.raises(SGLangError, match="update_weights_from_disk"):
    served.engine.update_weights(served.model, version=2)
  assert sorted(os.listdir(served.engine.weight_dir)) == ["v1"]
