"""The packaged SmolLM2-135M-Instruct end to end, against transformers loading the same GGUF.

The reference is transformers' own GGUF import (`load_gguf_checkpoint`: its name mapping,
q/k un-permutation and dequantization) into its torch LlamaForCausalLM, in float32; its
tokenizer is `AutoTokenizer.from_pretrained(..., gguf_file=...)`.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest
from flax import nnx

from rised_jax import demo
from rised_jax.model import packaged

torch = pytest.importorskip("torch")
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402

NAME = "smollm2-135m-instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def reference():
  path = packaged.resolve(NAME)
  config = dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"])
  model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config.pop("model_type"), **config),
                                           dtype=torch.float32)
  tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
  result = model.load_state_dict(tensors, strict=False)
  assert result.missing_keys == ["lm_head.weight"] and not result.unexpected_keys  # tied head
  model.tie_weights()
  tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  return model.eval(), tokenizer


@pytest.mark.slow
def test_logits_match_transformers(smollm2, reference):
  model, tokenizer = smollm2
  ref_model, ref_tokenizer = reference
  texts = ["The capital of France is", "def add(a, b):\n    return",
           tokenizer.render_chat(FRANCE)]
  rows = [ref_tokenizer.encode(t, add_special_tokens=False) for t in texts]
  width = max(map(len, rows))
  ids = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for r, row in enumerate(rows):
    ids[r, :len(row)], mask[r, :len(row)] = row, 1
  logits = np.asarray(nnx.jit(lambda m, i, a: m(i, a))(model, ids, mask))
  with torch.no_grad():
    expected = ref_model(input_ids=torch.from_numpy(ids).long(),
                         attention_mask=torch.from_numpy(mask).long()).logits.numpy()
  valid = mask.astype(bool)
  max_error = float(np.abs(logits[valid] - expected[valid]).max())
  print(f"max |logit difference| over {valid.sum()} positions: {max_error:.2e}")
  assert max_error < 1e-3, max_error
  assert np.array_equal(logits[valid].argmax(-1), expected[valid].argmax(-1))


@pytest.mark.slow
def test_greedy_answer_names_paris_like_transformers(smollm2, reference):
  model, tokenizer = smollm2
  ref_model, _ = reference
  prompt = tokenizer.encode_chat(FRANCE)
  [answer] = demo.greedy_generate(model, [prompt], 16, tokenizer.stop_token_ids)
  assert "Paris" in tokenizer.decode(answer, skip_special_tokens=True)
  assert answer[-1] in tokenizer.stop_token_ids       # it ended its turn, within 16 tokens
  with torch.no_grad():
    expected = ref_model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                  eos_token_id=list(tokenizer.stop_token_ids), pad_token_id=2)
  assert answer == expected[0, len(prompt):].tolist()


@pytest.mark.slow
def test_tokenizer_matches_transformers(smollm2, reference):
  _, tokenizer = smollm2
  _, ref_tokenizer = reference
  rendered = ref_tokenizer.apply_chat_template(FRANCE, tokenize=False, add_generation_prompt=True)
  assert tokenizer.render_chat(FRANCE) == rendered
  assert rendered.endswith("<|im_start|>assistant\n")
  assert tokenizer.encode_chat(FRANCE) == ref_tokenizer.encode(rendered, add_special_tokens=False)
  for text in ["Hello, world!", "  leading spaces and\ttabs\n", "Ünïcödé ✓ 😀",
               "<|im_start|>user\nMove left.<|im_end|>"]:
    assert tokenizer.encode(text) == ref_tokenizer.encode(text, add_special_tokens=False), text
    assert tokenizer.decode(tokenizer.encode(text)) == text
  assert tokenizer.stop_token_ids[0] == ref_tokenizer.eos_token_id == 2   # <|im_end|>
  assert tokenizer.vocab_size == len(ref_tokenizer) == 49152


@pytest.mark.slow
def test_demo_prints_the_answer(smollm2, capsys, monkeypatch):
  loaded = []
  monkeypatch.setattr(demo, "from_pretrained", lambda name: loaded.append(name) or smollm2)
  assert demo.main(["--prompt", "What is the capital of France?", "--max-new-tokens", "12"]) == 0
  assert loaded == [NAME]
  out = capsys.readouterr().out
  assert "> What is the capital of France?" in out and "Paris" in out


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["--prompt", "  "], "--prompt must not be empty"),
])
def test_demo_rejects_bad_flags_before_loading(argv, message, capsys):
  with pytest.raises(SystemExit):
    demo.main(argv)
  assert message in capsys.readouterr().err
