"""`ModelConfig`: one frozen description of every supported decoder, read from and written to
Hugging Face `config.json` dicts.

Supported families (by `model_type`, the HF class in brackets):

  llama        [LlamaForCausalLM]   GQA/MQA, optional q/k/v/o and MLP biases, tied or untied.
  qwen2        [Qwen2ForCausalLM]   bias on q/k/v (never on o).
  qwen3        [Qwen3ForCausalLM]   QK-norm (RMSNorm over head_dim), explicit head_dim.
  gemma3_text  [Gemma3ForCausalLM]  sliding-window and global layers with separate RoPE bases,
                                    sandwich norms, QK-norm, (1 + w) RMSNorm, embeddings scaled
                                    by sqrt(hidden), query_pre_attn_scalar, gelu-tanh MLP,
                                    optional logit softcapping.

RoPE: "default", "linear" and "llama3" scaling; any other kind is refused by name. Both the
transformers 5.x layout (`rope_parameters`, nested by layer type for Gemma 3) and the legacy
one (`rope_theta`, `rope_scaling`, `rope_local_base_freq`) are read; `to_hf` writes both, so
transformers 5.x and older readers (e.g. an SGLang server on transformers 4.x) agree.
Keys a family does not state fall back to that transformers class's defaults.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Mapping

import numpy as np

from rised_jax.model.errors import ModelConfigError
from rised_jax.checks import is_int, is_number

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
ROPE_KINDS = ("default", "linear", "llama3")
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
  """Rotary embedding frequencies of one attention type."""

  theta: float
  kind: str = "default"                       # one of ROPE_KINDS
  factor: float = 1.0                         # linear and llama3
  low_freq_factor: float = 1.0                # llama3
  high_freq_factor: float = 4.0               # llama3
  original_max_position_embeddings: int = 0   # llama3

  def inv_freq(self, head_dim: int) -> np.ndarray:
    """The [head_dim // 2] inverse frequencies (float32), scaled as `kind` says."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    inv_freq = 1.0 / (self.theta ** exponents)
    if self.kind == "linear":
      inv_freq = inv_freq / self.factor
    elif self.kind == "llama3":
      # Long wavelengths are divided by `factor`, short ones kept, the band between the two
      # thresholds interpolated (Llama 3.1's recipe).
      wavelen = 2 * math.pi / inv_freq
      context = self.original_max_position_embeddings
      low_freq_wavelen = context / self.low_freq_factor
      high_freq_wavelen = context / self.high_freq_factor
      smooth = (context / wavelen - self.low_freq_factor) / (
          self.high_freq_factor - self.low_freq_factor)
      interpolated = (1 - smooth) * inv_freq / self.factor + smooth * inv_freq
      inv_freq = np.where(wavelen > low_freq_wavelen, inv_freq / self.factor,
                          np.where(wavelen < high_freq_wavelen, inv_freq, interpolated))
    return inv_freq.astype(np.float32)

  def to_hf(self) -> dict[str, Any]:
    """This RoPE as a transformers 5.x `rope_parameters` entry."""
    params: dict[str, Any] = {"rope_type": self.kind, "rope_theta": self.theta}
    if self.kind in ("linear", "llama3"):
      params["factor"] = self.factor
    if self.kind == "llama3":
      params.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor,
                    original_max_position_embeddings=self.original_max_position_embeddings)
    return params


@dataclasses.dataclass(frozen=True)
class _Family:
  """What a transformers class fixes or defaults for one `model_type`."""

  architecture: str
  activation_key: str
  default_activation: str
  default_head_dim: int | None        # None: hidden_size // num_attention_heads
  default_rope_theta: float
  default_max_positions: int
  default_tie: bool
  qk_norm: bool
  gemma: bool                         # sandwich norms, (1 + w), scaled embeddings, local RoPE


_FAMILIES = {
    "llama": _Family("LlamaForCausalLM", "hidden_act", "silu", None, 10_000.0, 2048, False,
                     qk_norm=False, gemma=False),
    "qwen2": _Family("Qwen2ForCausalLM", "hidden_act", "silu", None, 10_000.0, 32768, False,
                     qk_norm=False, gemma=False),
    "qwen3": _Family("Qwen3ForCausalLM", "hidden_act", "silu", 128, 10_000.0, 32768, False,
                     qk_norm=True, gemma=False),
    "gemma3_text": _Family("Gemma3ForCausalLM", "hidden_activation", "gelu_pytorch_tanh", 256,
                           1_000_000.0, 131072, True, qk_norm=True, gemma=True),
}
_GEMMA3_LOCAL_ROPE_THETA = 10_000.0
_GEMMA3_SLIDING_PATTERN = 6
_GEMMA3_SLIDING_WINDOW = 4096
_GEMMA3_QUERY_PRE_ATTN_SCALAR = 256.0
_QWEN_SLIDING_WINDOW = 4096
_QWEN_MAX_WINDOW_LAYERS = 28


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a decoder-only LM; family traits are derived from `model_type`."""

  model_type: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  layer_types: tuple[str, ...]
  rope: RopeConfig                            # global (full-attention) layers
  local_rope: RopeConfig | None = None        # sliding layers, when their RoPE differs (Gemma 3)
  sliding_window: int | None = None           # keys with position distance < window are seen
  rms_norm_eps: float = 1e-6
  hidden_act: str = "silu"
  tie_word_embeddings: bool = False
  attention_bias: bool = False                # HF `attention_bias` (llama, qwen3, gemma3)
  mlp_bias: bool = False                      # llama only
  query_pre_attn_scalar: float | None = None  # Gemma 3: scores scaled by this ** -0.5
  final_logit_softcap: float | None = None
  attn_logit_softcap: float | None = None
  max_position_embeddings: int = 2048
  initializer_range: float = 0.02
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  source: str = dataclasses.field(default="ModelConfig", compare=False)

  def __post_init__(self):
    if self.model_type not in _FAMILIES:
      self._fail("model_type", f"must be one of {sorted(_FAMILIES)}, got {self.model_type!r}")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim"):
      value = getattr(self, key)
      if not is_int(value) or value < 1:
        self._fail(key, f"must be a positive integer, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      self._fail("num_key_value_heads", f"({self.num_kv_heads}) must divide "
                 f"num_attention_heads ({self.num_heads})")
    if self.head_dim % 2:
      self._fail("head_dim", f"must be even for rotary embeddings, got {self.head_dim}")
    if len(self.layer_types) != self.num_layers or any(
        t not in LAYER_TYPES for t in self.layer_types):
      self._fail("layer_types", f"must list {self.num_layers} entries from {LAYER_TYPES}, "
                 f"got {list(self.layer_types)}")
    if SLIDING_ATTENTION in self.layer_types and not (
        isinstance(self.sliding_window, int) and self.sliding_window >= 1):
      self._fail("sliding_window", f"must be a positive integer when a layer is "
                 f"'{SLIDING_ATTENTION}', got {self.sliding_window!r}")
    if self.hidden_act not in ACTIVATIONS:
      self._fail(self.family.activation_key,
                 f"must be one of {ACTIVATIONS}, got {self.hidden_act!r}")
    if self.mlp_bias and self.model_type != "llama":
      self._fail("mlp_bias", f"is only supported for llama, not {self.model_type}")
    if self.local_rope is not None and not self.family.gemma:
      self._fail("rope_parameters", f"a separate sliding-layer RoPE is only supported for "
                 f"gemma3_text, not {self.model_type}")
    if self.model_type == "qwen2" and self.attention_bias:
      self._fail("attention_bias", "is fixed by qwen2 (bias on q/k/v only); leave it false")
    # Normal forms, so that from_hf(to_hf(c)) == c: Gemma 3 always states both RoPEs, and a
    # window without sliding layers means nothing.
    if self.family.gemma and self.local_rope is None:
      object.__setattr__(self, "local_rope", self.rope)
    if SLIDING_ATTENTION not in self.layer_types:
      object.__setattr__(self, "sliding_window", None)

  def _fail(self, key: str, message: str):
    raise ModelConfigError(f"{self.source}: key '{key}' {message}")

  # Traits fixed by the family.
  @property
  def family(self) -> _Family:
    return _FAMILIES[self.model_type]

  @property
  def architecture(self) -> str:
    return self.family.architecture

  @property
  def qkv_bias(self) -> bool:
    return self.model_type == "qwen2" or self.attention_bias

  @property
  def o_bias(self) -> bool:
    return self.model_type != "qwen2" and self.attention_bias

  @property
  def qk_norm(self) -> bool:
    return self.family.qk_norm

  @property
  def sandwich_norms(self) -> bool:
    """Gemma: RMSNorm after attention and after the MLP as well as before them."""
    return self.family.gemma

  @property
  def norm_plus_one(self) -> bool:
    """Gemma: RMSNorm scales by (1 + w), so w is stored as an offset from one."""
    return self.family.gemma

  @property
  def embed_scale(self) -> float | None:
    """Gemma multiplies the embeddings by sqrt(hidden_size)."""
    return math.sqrt(self.hidden_size) if self.family.gemma else None

  @property
  def attn_scale(self) -> float:
    return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

  def layer_rope(self, layer: int) -> RopeConfig:
    if self.layer_types[layer] == SLIDING_ATTENTION and self.local_rope is not None:
      return self.local_rope
    return self.rope

  def layer_window(self, layer: int) -> int | None:
    return self.sliding_window if self.layer_types[layer] == SLIDING_ATTENTION else None

  @classmethod
  def from_hf(cls, config: Mapping[str, Any], source: str = "config dict") -> ModelConfig:
    """Reads an HF `config.json` dict; `source` (the file) is named in every error."""
    if not isinstance(config, Mapping):
      raise ModelConfigError(f"{source}: expected a JSON object, got {type(config).__name__}")
    reader = _Reader(config, source)
    model_type = config.get("model_type")
    if model_type == "gemma3":
      reader.fail("model_type", "is the multimodal Gemma 3 (Gemma3ForConditionalGeneration); "
                  "only its text-only form is supported (model_type 'gemma3_text', "
                  "Gemma3ForCausalLM)")
    if model_type not in _FAMILIES:
      reader.fail("model_type", f"must be one of {sorted(_FAMILIES)}, got {model_type!r}")
    family = _FAMILIES[model_type]
    architectures = config.get("architectures")
    if architectures and family.architecture not in architectures:
      reader.fail("architectures", f"must contain {family.architecture!r} for model_type "
                  f"{model_type!r}, got {architectures}")

    hidden = reader.get_int("hidden_size")
    heads = reader.get_int("num_attention_heads")
    num_layers = reader.get_int("num_hidden_layers")
    head_dim = reader.get_int("head_dim", family.default_head_dim)
    if head_dim is None:
      if hidden % heads:
        reader.fail("head_dim", f"is absent and hidden_size ({hidden}) is not a multiple of "
                    f"num_attention_heads ({heads})")
      head_dim = hidden // heads
    max_positions = reader.get_int("max_position_embeddings", family.default_max_positions)
    layer_types, window = _read_layer_types(reader, model_type, num_layers)
    rope, local_rope = _read_rope(reader, family, max_positions)
    if family.gemma and reader.get_bool("use_bidirectional_attention", False):
      reader.fail("use_bidirectional_attention", "must be false: only causal decoding is "
                  "supported")
    attn_softcap = reader.get_float("attn_logit_softcapping", None)
    if family.gemma and attn_softcap is not None:
      warnings.warn(f"{source}: attn_logit_softcapping={attn_softcap} is applied here, but "
                    f"transformers 5.x ignores it for Gemma 3 (its checkpoints set it to null)")
    return cls(
        model_type=model_type,
        vocab_size=reader.get_int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=reader.get_int("intermediate_size"),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=reader.get_int("num_key_value_heads", heads),
        head_dim=head_dim,
        layer_types=layer_types,
        rope=rope,
        local_rope=local_rope,
        sliding_window=window,
        rms_norm_eps=reader.get_float("rms_norm_eps", 1e-6),
        hidden_act=reader.get_str(family.activation_key, family.default_activation),
        tie_word_embeddings=reader.get_bool("tie_word_embeddings", family.default_tie),
        attention_bias=(model_type != "qwen2" and reader.get_bool("attention_bias", False)),
        mlp_bias=(model_type == "llama" and reader.get_bool("mlp_bias", False)),
        query_pre_attn_scalar=(
            reader.get_float("query_pre_attn_scalar", _GEMMA3_QUERY_PRE_ATTN_SCALAR)
            if family.gemma else None),
        final_logit_softcap=reader.get_float("final_logit_softcapping", None),
        attn_logit_softcap=attn_softcap,
        max_position_embeddings=max_positions,
        initializer_range=reader.get_float("initializer_range", 0.02),
        bos_token_id=reader.token_id("bos_token_id"),
        eos_token_id=reader.token_ids("eos_token_id"),
        pad_token_id=reader.token_id("pad_token_id"),
        source=source,
    )

  def to_hf(self) -> dict[str, Any]:
    """A config.json dict that transformers (5.x and 4.x) loads as this architecture."""
    family = self.family
    config: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        family.activation_key: self.hidden_act,
        "rms_norm_eps": self.rms_norm_eps,
        "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
        "initializer_range": self.initializer_range,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": (list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
                         else self.eos_token_id),
        "pad_token_id": self.pad_token_id,
        "rope_theta": self.rope.theta,
        "rope_scaling": _legacy_rope_scaling(self.rope),
    }
    if self.model_type != "llama":   # llama has no sliding layers
      config["layer_types"] = list(self.layer_types)
      config["sliding_window"] = self.sliding_window
    if self.model_type != "qwen2":
      config["attention_bias"] = self.attention_bias
    if self.model_type == "llama":
      config["mlp_bias"] = self.mlp_bias
    if self.model_type in ("qwen2", "qwen3"):
      sliding = [i for i, t in enumerate(self.layer_types) if t == SLIDING_ATTENTION]
      config["use_sliding_window"] = bool(sliding)
      config["max_window_layers"] = sliding[0] if sliding else self.num_layers
    if family.gemma:
      local_rope = self.local_rope or self.rope
      config["rope_parameters"] = {FULL_ATTENTION: self.rope.to_hf(),
                                   SLIDING_ATTENTION: local_rope.to_hf()}
      config["rope_local_base_freq"] = local_rope.theta
      # transformers 5.x validates this field as an int.
      scalar = self.query_pre_attn_scalar
      config["query_pre_attn_scalar"] = int(scalar) if float(scalar).is_integer() else scalar
      config["final_logit_softcapping"] = self.final_logit_softcap
      config["attn_logit_softcapping"] = self.attn_logit_softcap
      pattern = _periodic_pattern(self.layer_types)
      if pattern is not None:
        config["sliding_window_pattern"] = pattern
    else:
      config["rope_parameters"] = self.rope.to_hf()
    return config


def _legacy_rope_scaling(rope: RopeConfig) -> dict[str, Any] | None:
  """The pre-5.x `rope_scaling` entry (theta lives in `rope_theta` there)."""
  if rope.kind == "default":
    return None
  return {k: v for k, v in rope.to_hf().items() if k != "rope_theta"}


def _periodic_pattern(layer_types: tuple[str, ...]) -> int | None:
  """p such that every p-th layer is global and the rest sliding (Gemma's legacy key)."""
  for pattern in range(1, len(layer_types) + 2):
    expected = tuple(SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION
                     for i in range(len(layer_types)))
    if expected == layer_types:
      return pattern
  return None


def _read_layer_types(reader: _Reader, model_type: str,
                      num_layers: int) -> tuple[tuple[str, ...], int | None]:
  """Per-layer attention type and the sliding window, as the transformers classes derive them."""
  config = reader.config
  if model_type == "gemma3_text":
    window = reader.get_int("sliding_window", _GEMMA3_SLIDING_WINDOW, allow_none=True)
    pattern = reader.get_int("sliding_window_pattern",
                             config.get("_sliding_window_pattern", _GEMMA3_SLIDING_PATTERN))
    derived = [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION
               for i in range(num_layers)]
  elif model_type in ("qwen2", "qwen3"):
    use_window = reader.get_bool("use_sliding_window", False)
    window = (reader.get_int("sliding_window", _QWEN_SLIDING_WINDOW, allow_none=True)
              if use_window else None)
    first_sliding = reader.get_int("max_window_layers", _QWEN_MAX_WINDOW_LAYERS, minimum=0)
    derived = [SLIDING_ATTENTION if window is not None and i >= first_sliding else FULL_ATTENTION
               for i in range(num_layers)]
  else:
    window = None
    derived = [FULL_ATTENTION] * num_layers
  layer_types = config.get("layer_types")
  if layer_types is None:
    layer_types = derived
  elif model_type == "llama" and layer_types != derived:
    reader.fail("layer_types", f"must all be '{FULL_ATTENTION}' for llama, got {layer_types}")
  if (not isinstance(layer_types, list) or len(layer_types) != num_layers
      or any(t not in LAYER_TYPES for t in layer_types)):
    reader.fail("layer_types", f"must list num_hidden_layers={num_layers} entries from "
                f"{LAYER_TYPES}, got {layer_types!r}")
  return tuple(layer_types), window


def _read_rope(reader: _Reader, family: _Family,
               max_positions: int) -> tuple[RopeConfig, RopeConfig | None]:
  """The global RoPE and, for Gemma 3, the sliding layers' RoPE.

  Precedence follows transformers: a legacy `rope_scaling` wins over `rope_parameters`; a
  theta inside the parameters wins over the top-level `rope_theta`.
  """
  config = reader.config
  theta = reader.get_float("rope_theta", family.default_rope_theta)
  params = config.get("rope_parameters") or {}
  if not isinstance(params, Mapping):
    reader.fail("rope_parameters", f"must be an object, got {params!r}")
  nested = any(key in LAYER_TYPES for key in params)
  if family.gemma:
    local_theta = reader.get_float("rope_local_base_freq", _GEMMA3_LOCAL_ROPE_THETA)
    global_params = dict(params.get(FULL_ATTENTION) or {}) if nested else dict(params)
    local_params = dict(params.get(SLIDING_ATTENTION) or {}) if nested else {}
    if config.get("rope_scaling"):
      global_params.update(reader.mapping("rope_scaling"))
    global_rope = _rope_from_params(reader, global_params, theta, max_positions,
                                    f"rope_parameters.{FULL_ATTENTION}")
    local_rope = _rope_from_params(reader, local_params, local_theta, max_positions,
                                   f"rope_parameters.{SLIDING_ATTENTION}")
    return global_rope, local_rope
  if nested:
    reader.fail("rope_parameters", f"per-layer-type RoPE is only supported for gemma3_text, "
                f"got keys {sorted(params)}")
  if config.get("rope_scaling"):
    return _rope_from_params(reader, reader.mapping("rope_scaling"), theta, max_positions,
                             "rope_scaling"), None
  return _rope_from_params(reader, params, theta, max_positions, "rope_parameters"), None


def _rope_from_params(reader: _Reader, params: Mapping[str, Any], default_theta: float,
                      max_positions: int, key: str) -> RopeConfig:
  sub = _Reader(params, reader.source, prefix=f"{key}.")
  kind = params.get("rope_type", params.get("type", "default"))
  if kind not in ROPE_KINDS:
    sub.fail("rope_type", f"must be one of {ROPE_KINDS} (others are not implemented), "
             f"got {kind!r}")
  partial = params.get("partial_rotary_factor", reader.config.get("partial_rotary_factor"))
  if partial not in (None, 1, 1.0):
    sub.fail("partial_rotary_factor", f"must be 1.0 (partial rotary is not implemented), "
             f"got {partial!r}")
  theta = sub.get_float("rope_theta", default_theta)
  if kind == "default":
    return RopeConfig(theta=theta)
  factor = sub.get_float("factor")
  if factor <= 0:
    sub.fail("factor", f"must be positive, got {factor}")
  if kind == "linear":
    return RopeConfig(theta=theta, kind=kind, factor=factor)
  low = sub.get_float("low_freq_factor")
  high = sub.get_float("high_freq_factor")
  if high <= low:
    sub.fail("high_freq_factor", f"({high}) must exceed low_freq_factor ({low})")
  return RopeConfig(theta=theta, kind=kind, factor=factor, low_freq_factor=low,
                    high_freq_factor=high,
                    original_max_position_embeddings=sub.get_int(
                        "original_max_position_embeddings", max_positions))


_REQUIRED = object()


class _Reader:
  """Typed access to a config dict; every failure names the source file and the key."""

  def __init__(self, config: Mapping[str, Any], source: str, prefix: str = ""):
    self.config = config
    self.source = source
    self.prefix = prefix

  def fail(self, key: str, message: str):
    raise ModelConfigError(f"{self.source}: key '{self.prefix}{key}' {message}")

  def _get(self, key: str, default: Any) -> Any:
    if key in self.config:
      return self.config[key]
    if default is _REQUIRED:
      self.fail(key, "is missing")
    return default

  def get_int(self, key: str, default: Any = _REQUIRED, minimum: int = 1,
          allow_none: bool = False) -> Any:
    value = self._get(key, default)
    if value is None and (allow_none or default is None):
      return None
    if isinstance(value, float) and value.is_integer():
      value = int(value)
    if not is_int(value) or value < minimum:
      self.fail(key, f"must be an integer >= {minimum}, got {value!r}")
    return value

  def get_float(self, key: str, default: Any = _REQUIRED) -> Any:
    value = self._get(key, default)
    if value is None and default is None:
      return None
    if not is_number(value):
      self.fail(key, f"must be a finite number, got {value!r}")
    return float(value)

  def get_bool(self, key: str, default: bool) -> bool:
    value = self._get(key, default)
    if not isinstance(value, bool):
      self.fail(key, f"must be true or false, got {value!r}")
    return value

  def get_str(self, key: str, default: str) -> str:
    value = self._get(key, default)
    if not isinstance(value, str):
      self.fail(key, f"must be a string, got {value!r}")
    return value

  def mapping(self, key: str) -> dict[str, Any]:
    value = self._get(key, _REQUIRED)
    if not isinstance(value, Mapping):
      self.fail(key, f"must be an object, got {value!r}")
    return dict(value)

  def token_id(self, key: str) -> int | None:
    return self.get_int(key, None, minimum=0)

  def token_ids(self, key: str) -> int | tuple[int, ...] | None:
    value = self._get(key, None)
    if isinstance(value, list):
      if not all(is_int(v) and v >= 0 for v in value):
        self.fail(key, f"must be a token id or a list of token ids, got {value!r}")
      return tuple(value)
    return self.token_id(key)
