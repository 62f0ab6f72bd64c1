"""Planning table: the paper configs' train step on a TPU v5p-64 slice and an 8×H100 node,
predicted from the step's model FLOPs and published chip figures (nothing here is measured on
an accelerator; `benchmarks/device_check.sh` is the measurement to put beside it).

Method, per config (its own file, as rised-train reads it):
- rows = B groups × G rollouts trained per step, columns = the longest trained sequence
  (agentic: rollout.max_total_tokens; rubric: a 512-token prompt + rubric.max_new_tokens), the
  padded batch the step computes on;
- model FLOPs = `rised_jax.learn.flops.train_step_flops` (student forward + backward, one
  stop-gradient forward per teacher row set: RISED's positive teacher, CriPO's injection and
  counterfactual teachers), for the published Qwen3 architectures;
- step seconds = FLOPs / (chips × published dense bf16 peak × MFU), for MFU 0.3 and 0.5 (the
  range well-tuned JAX LLM training reaches; not a measurement of this code);
- memory per chip, FSDP over every chip: fp32 master weights and two fp32 Adam moments
  (12 B/param) + a bf16 compute copy and, with the reference KL, bf16 reference weights
  (2 B/param each), divided by the chips; plus remat activations: one bf16 [rows per chip per
  micro-batch, columns, hidden] tensor per layer kept for the backward pass.

  python benchmarks/plan.py [--out benchmarks/results/plan.json]
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from benchmarks import common
from rised_jax.learn import flops
from rised_jax.model import ModelConfig

# Qwen3's published config.json values (tied embeddings, head_dim 128, vocab 151 936).
_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
          "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
          "rope_theta": 1_000_000.0, "tie_word_embeddings": True,
          "max_position_embeddings": 40960}
QWEN3 = {
    "1.7b": {**_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
             "num_attention_heads": 16},
    "4b": {**_QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
           "num_attention_heads": 32},
}
# (chips, dense bf16 peak FLOP/s per chip, HBM bytes per chip); v5p-64 counts 64 TensorCores,
# two per chip.
MACHINES = {"TPU v5p-64": (32, 459e12, 95e9), "8×H100 SXM": (8, 989e12, 80e9)}
CONFIGS = {
    "RISED Qwen3-4B": ("experiments/configs/rised_qwen3_multienv.py:rised,4b", "4b"),
    "RISED Qwen3-1.7B": ("experiments/configs/rised_qwen3_multienv.py:rised,1.7b", "1.7b"),
    "CriPO Qwen3-4B": ("experiments/configs/cripo_qwen3_4b.py:cripo", "4b"),
    "CriPO Qwen3-1.7B": ("experiments/configs/cripo_qwen3_1p7b.py:cripo", "1.7b"),
}
MFU_RANGE = (0.3, 0.5)
RUBRIC_PROMPT_TOKENS = 512


def _params(cfg: ModelConfig) -> int:
  """Every weight of a tied Qwen3: the matmuls, the embedding, and the norms (two per layer,
  q/k norms of head_dim, the final norm)."""
  norms = cfg.num_layers * (2 * cfg.hidden_size + 2 * cfg.head_dim) + cfg.hidden_size
  return flops.nonembedding_params(cfg) + cfg.vocab_size * cfg.hidden_size + norms


def plan_row(name: str, spec: str, size: str) -> dict:
  config = common.load_config(str(common.REPO_ROOT / spec.split(":")[0]) + ":" +
                              spec.split(":")[1])
  cfg = ModelConfig.from_hf(QWEN3[size], source=f"Qwen3-{size}")
  rows = config.select.batch_groups * config.rollout.group_size
  if config.pipeline == "rubric":
    columns = RUBRIC_PROMPT_TOKENS + config.rubric.max_new_tokens
    teachers = int(config.step.beta > 0) + int(config.step.counterfactual)
  else:
    columns = config.rollout.max_total_tokens
    teachers = int(config.step.beta > 0)
  step_flops = flops.train_step_flops(cfg, rows, columns, teacher_forwards=teachers)["total"]
  params = _params(cfg)
  ref = config.step.ref_kl_coef > 0
  row = {"config": name, "spec": spec, "params": params, "rows": rows, "columns": columns,
         "teacher_forwards": teachers, "model_tflops_per_step": step_flops / 1e12,
         "machines": {}}
  for machine, (chips, peak, hbm) in MACHINES.items():
    state = params * (12 + 2 + 2 * ref) / chips
    rows_per_chip = math.ceil(rows / chips / config.step.micro_batches)
    activations = cfg.num_layers * rows_per_chip * columns * cfg.hidden_size * 2
    seconds = [step_flops / (chips * peak * mfu) for mfu in MFU_RANGE]
    row["machines"][machine] = {
        "chips": chips, "step_seconds_at_mfu": dict(zip(map(str, MFU_RANGE), seconds)),
        "padded_tokens_per_s_at_mfu": {str(m): rows * columns / s
                                        for m, s in zip(MFU_RANGE, seconds)},
        "state_gb_per_chip": state / 1e9, "activation_gb_per_chip": activations / 1e9,
        "hbm_gb_per_chip": hbm / 1e9}
  return row


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=str(common.RESULTS_DIR / "plan.json"))
  args = parser.parse_args(argv)
  rows = [plan_row(name, *spec) for name, spec in CONFIGS.items()]
  print("| config | rows × columns | TFLOP/step | machine | step s (MFU 0.5–0.3) | "
        "padded tokens/s (MFU 0.5–0.3) | state + activations GB/chip (of HBM) |")
  print("|---|---|---|---|---|---|---|")
  for row in rows:
    for machine, m in row["machines"].items():
      lo, hi = m["step_seconds_at_mfu"]["0.5"], m["step_seconds_at_mfu"]["0.3"]
      t_hi, t_lo = (m["padded_tokens_per_s_at_mfu"][k] for k in ("0.5", "0.3"))
      print(f"| {row['config']} | {row['rows']} × {row['columns']} | "
            f"{row['model_tflops_per_step']:.0f} | {machine} | {lo:.1f}–{hi:.1f} | "
            f"{t_lo:,.0f}–{t_hi:,.0f} | {m['state_gb_per_chip']:.1f} + "
            f"{m['activation_gb_per_chip']:.1f} ({m['hbm_gb_per_chip']:.0f}) |")
  path = common.write_json(args.out, {"method": __doc__, "mfu_range": MFU_RANGE,
                                      "machines": MACHINES, "configs": rows})
  print(f"wrote {Path(path)}")


if __name__ == "__main__":
  main()
