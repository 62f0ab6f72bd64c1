"""The rollout engine a typed rollout config (`rollout.settings.RolloutConfig`) names.

`make_engine` builds it: the in-process `JaxEngine` or the `SGLangEngine` client. Its request
limits are known before any model is loaded (`RolloutConfig.limits()`), so a stage checks its
longest prompt and reply against the config alone.
"""
from __future__ import annotations

from typing import Any

from rised_jax.rollout.base import Engine
from rised_jax.rollout.settings import RolloutConfig


def make_engine(rollout: RolloutConfig, model: Any, tokenizer: Any, *, weight_dir: str,
                export_dtype: str) -> Engine:
  """The engine `rollout.engine` names, sampling `model`; `weight_dir` and `export_dtype`:
  where and in which dtype SGLang's weight sync exports (unused in-process)."""
  if rollout.engine == "jax":
    from rised_jax.rollout.jax_engine import JaxEngine  # noqa: PLC0415 - optional stage
    return JaxEngine(model, max_batch=rollout.max_batch, pad_id=tokenizer.pad_token_id,
                     batch_buckets=rollout.batch_buckets or None,
                     prompt_buckets=rollout.prompt_buckets,
                     max_new_tokens_buckets=rollout.new_token_buckets,
                     reuse_prefix=rollout.reuse_prefix,
                     decode_chunk=rollout.decode_chunk or None,
                     matmul_operands=rollout.matmul_operands)
  from rised_jax.rollout.sglang_engine import SGLangEngine  # noqa: PLC0415
  sglang = rollout.sglang
  return SGLangEngine(rollout.sglang_url, tokenizer=tokenizer, weight_dir=weight_dir,
                      timeout_s=sglang.timeout_s, max_retries=sglang.retries,
                      max_reply_bytes=sglang.max_reply_bytes, vocab_size=model.cfg.vocab_size,
                      export_dtype=export_dtype, weight_sync=sglang.weight_sync,
                      tensor_bucket_bytes=sglang.tensor_bucket_bytes)
