"""Tiny model helpers shared by the model tests (and any test that needs a small real model).

  TINY_CONFIGS        name -> HF config.json dict of a tiny model of each supported family
  hf_model(config)    the transformers (torch, fp32, eager attention) model with every
                      parameter random, norms and biases included
  state_of(hf_model)  its HF-named numpy state dict
  decoder_from_hf     our Decoder holding the same weights
  random_decoder      our Decoder with every parameter random (no torch needed)
  padded_batch        left- or right-padded id/mask arrays from rows of ids
  tiny_tokenizer      a ChatML tokenizer trained in-process (no download)

torch and transformers are imported lazily, so torch-free tests can use the rest.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rised_jax.model import DTYPES, ModelConfig, Tokenizer
from rised_jax.model.hf_io import build_from_state, weight_specs

VOCAB = 97
_BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             max_position_embeddings=128, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    # Multi-head attention, untied, plain RoPE.
    "llama_mha": dict(_BASE, model_type="llama", architectures=["LlamaForCausalLM"],
                      num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                      rope_theta=10_000.0),
    # GQA 4:2, tied (SmolLM2-style), linear RoPE scaling in the legacy `rope_scaling` form.
    "llama_gqa_tied": dict(_BASE, model_type="llama", architectures=["LlamaForCausalLM"],
                           num_attention_heads=4, num_key_value_heads=2,
                           tie_word_embeddings=True, rope_theta=500.0,
                           rope_scaling={"type": "linear", "factor": 2.0}),
    # MQA 4:1 with every bias, llama3 RoPE scaling (all three frequency bands hit).
    "llama_mqa_bias": dict(_BASE, model_type="llama", architectures=["LlamaForCausalLM"],
                           num_attention_heads=4, num_key_value_heads=1,
                           tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
                           rope_parameters={"rope_type": "llama3", "rope_theta": 10_000.0,
                                            "factor": 4.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64}),
    "qwen2_bias": dict(_BASE, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                       rope_theta=1_000_000.0),
    # Sliding window (5, shorter than the test rows) on the layers from max_window_layers on.
    "qwen2_sliding": dict(_BASE, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                          tie_word_embeddings=True, use_sliding_window=True, sliding_window=5,
                          max_window_layers=1),
    # QK-norm, head_dim (16) != hidden / heads (8).
    "qwen3_tied": dict(_BASE, model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       tie_word_embeddings=True, rope_theta=1_000_000.0),
    "qwen3_untied": dict(_BASE, model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                         num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                         tie_word_embeddings=False, rope_theta=10_000.0, attention_bias=True),
    # Local/global mix with a window (4) shorter than the test sequences, separate RoPE bases,
    # linear scaling on the global layers, query_pre_attn_scalar != head_dim, final softcap.
    "gemma3": dict(_BASE, model_type="gemma3_text", architectures=["Gemma3ForCausalLM"],
                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, tie_word_embeddings=True, sliding_window=4,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                "full_attention"],
                   rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                   rope_scaling={"rope_type": "linear", "factor": 2.0},
                   query_pre_attn_scalar=24, final_logit_softcapping=3.0,
                   hidden_activation="gelu_pytorch_tanh"),
}


def tiny_config(name: str, **overrides: Any) -> dict[str, Any]:
  """A copy of TINY_CONFIGS[name] with overrides."""
  return {**copy.deepcopy(TINY_CONFIGS[name]), **overrides}


def hf_model(config: dict[str, Any], seed: int = 0):
  """The transformers model of an HF config dict, fp32, eager attention, every weight random.

  transformers initialises norms to one (zero for Gemma) and biases to zero; those are
  randomised too, so that a parity test exercises them.
  """
  import torch  # pylint: disable=import-outside-toplevel
  from transformers import AutoConfig, AutoModelForCausalLM  # pylint: disable=import-outside-toplevel

  hf_config = AutoConfig.for_model(**copy.deepcopy(config))
  torch.manual_seed(seed)
  model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager",
                                           dtype=torch.float32)
  generator = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, param in model.named_parameters():
      noise = torch.randn(param.shape, generator=generator)
      if name.endswith("norm.weight"):
        param.copy_((0.0 if config["model_type"] == "gemma3_text" else 1.0) + 0.2 * noise)
      elif name.endswith(".bias"):
        param.copy_(0.1 * noise)
      else:
        param.copy_(0.2 * noise)
  return model.eval()


def state_of(model) -> dict[str, np.ndarray]:
  """HF-named float32 numpy tensors (shared tied tensors appear under one name)."""
  return {name: tensor.detach().cpu().numpy().copy() for name, tensor in model.state_dict().items()
          if not (name == "lm_head.weight" and model.config.tie_word_embeddings)}


def decoder_from_hf(model, dtype: str = "float32", param_dtype: str | None = None,
                    remat: bool = False, scan_layers: bool = False):
  """Our Decoder with the weights of a transformers model."""
  cfg = ModelConfig.from_hf(model.config.to_dict(), source="transformers config")
  return build_from_state(cfg, state_of(model), "transformers state dict",
                          dtype=DTYPES[dtype], param_dtype=DTYPES[param_dtype or dtype],
                          remat=remat, scan_layers=scan_layers)


def hf_logits(model, ids: Sequence[int]) -> np.ndarray:
  """[len, V] transformers logits of one unpadded row."""
  import torch  # pylint: disable=import-outside-toplevel
  with torch.no_grad():
    return model(torch.tensor([list(ids)])).logits[0].numpy()


def random_state(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
  """HF-named float32 tensors for `cfg`, all random (norm scales around their neutral value)."""
  rng = np.random.default_rng(seed)
  state = {}
  for spec in weight_specs(cfg):
    noise = 0.2 * rng.standard_normal(spec.hf_shape, dtype=np.float32)
    neutral = 1.0 if spec.hf_name.endswith("norm.weight") and not cfg.norm_plus_one else 0.0
    state[spec.hf_name] = neutral + noise
  return state


def random_decoder(cfg: ModelConfig, seed: int = 0, dtype: str = "float32",
                   param_dtype: str | None = None, remat: bool = False,
                   scan_layers: bool = False):
  """A Decoder whose parameters (norm scales and biases included) are all random; no torch."""
  return build_from_state(cfg, random_state(cfg, seed), f"random_state(seed={seed})",
                          dtype=DTYPES[dtype], param_dtype=DTYPES[param_dtype or dtype],
                          remat=remat, scan_layers=scan_layers)


def random_rows(lengths: Sequence[int], seed: int = 0, vocab: int = VOCAB) -> list[list[int]]:
  """Rows of random ids (avoiding the pad/bos/eos ids 0-2)."""
  rng = np.random.default_rng(seed)
  return [rng.integers(3, vocab, size=n).tolist() for n in lengths]


def padded_batch(rows: Sequence[Sequence[int]], side: str, width: int | None = None,
                 pad_id: int = 0) -> tuple[jax.Array, jax.Array]:
  """(ids, mask) int32 [B, width], rows padded on `side` ("left" or "right")."""
  width = width or max(len(r) for r in rows)
  ids = np.full((len(rows), width), pad_id, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for b, row in enumerate(rows):
    cols = slice(width - len(row), width) if side == "left" else slice(0, len(row))
    ids[b, cols], mask[b, cols] = row, 1
  return jnp.asarray(ids), jnp.asarray(mask)


def real_columns(mask: np.ndarray, b: int) -> np.ndarray:
  return np.flatnonzero(np.asarray(mask)[b])


CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, move left then up",
           "push the box onto the goal; 0123456789"]


def tiny_tokenizer(with_template: bool = True) -> Tokenizer:
  """A byte-level BPE tokenizer (every byte encodable) with ChatML specials, trained here."""
  from tokenizers import Tokenizer as RawTokenizer  # pylint: disable=import-outside-toplevel
  from tokenizers import decoders, models, pre_tokenizers, trainers  # pylint: disable=import-outside-toplevel
  from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel

  raw = RawTokenizer(models.BPE())
  raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  raw.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      special_tokens=["<|pad|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"])
  raw.train_from_iterator(_CORPUS * 4, trainer)
  hf = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|im_start|>",
                               eos_token="<|im_end|>")
  return Tokenizer(hf, CHATML_TEMPLATE if with_template else None)


MOVES = ("up", "down", "left", "right")


def write_mover(out_dir, lift: float = 5.0, seed: int = 0):
  """The tiny FrozenLake model (`tiny.write(out_dir, ["frozenlake"])`) with the four move
  words' logits raised by about `lift` where the agent answers, so its random policy mostly
  names a move, each about equally often: GRPO then has wins to learn from in every step of
  one-move FrozenLake (the plain tiny model names the winning move in about 1 of 170 samples,
  so a step of 64 rollouts often has none). Each move's (tied) embedding gains
  lift · h̄ / |h̄|², h̄ the mean final hidden state at the answer position of FrozenLake's
  first prompts. Returns the directory."""
  from rised_jax import envs  # noqa: PLC0415 - keeps this module's imports light
  from rised_jax.model import from_config, save_pretrained, tiny  # noqa: PLC0415
  from rised_jax.rollout.chat import ChatFormat  # noqa: PLC0415
  tokenizer = tiny.build_tokenizer(tiny.tokenizer_words(["frozenlake"]))
  model = from_config(tiny.tiny_config(tokenizer.vocab_size), seed)
  chat = ChatFormat(tokenizer)
  env = envs.make("frozenlake", size=2, holes=0, min_distance=1, max_turns=1)
  answers = []
  for episode in range(8):
    ids = chat.prompt_ids(env.system_prompt, env.reset(episode))
    answers.append(model.hidden_states(jnp.asarray([ids]))[0, -1])
  mean = jnp.mean(jnp.stack(answers), axis=0)
  moves = jnp.asarray([tokenizer.encode(move)[0] for move in MOVES])
  model.embed[...] = model.embed[...].at[moves].add(lift * mean / jnp.sum(mean * mean))
  return save_pretrained(model, tokenizer, out_dir)
