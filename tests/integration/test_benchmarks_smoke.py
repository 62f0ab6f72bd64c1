"""Smoke tests of the benchmarks (benchmarks/train_step.py, loss_memory.py, vs_tunix.py,
scan_compile.py, e2e.py, main_job_changes.py, dot_precision.py, decode_profile.py): each runs its
whole code path at the tiniest setting, and the JSON it writes must hold consistent values
(ratios computed from the times it reports, FLOPs equal to a hand-worked count, memory parts
adding up, chunked = naive loss, stage times equal to the logged ones, each matmul form's
product against numpy, a decode step's kernels and bytes against the model's own count).
Wall-clock times are never asserted. The tunix
comparison runs only where `.venv-tunix` exists (vs_tunix.py creates it).
"""
from __future__ import annotations

import ast
import json
import math

import numpy as np
import pytest

from benchmarks import (common, decode_profile, dot_precision, loss_memory, sampler, scan_compile,
                        vs_tunix)
from benchmarks import train_step as train_step_bench

TINY = "qwen3-2l-d128"
ROWS, PROMPT, RESPONSE = 2, 8, 16
SEQ = PROMPT + RESPONSE


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
  return math.isclose(a, b, rel_tol=rel)


@pytest.fixture(scope="module")
def train_step_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench") / "train_step.json"
  # chunk >= T - 1: the chunked loss is one scan iteration, which XLA's cost analysis counts
  # fully (it counts a while-loop body once), so its FLOPs are comparable with ours.
  returned = train_step_bench.main([
      "--models", TINY, "--batch", str(ROWS), "--prompt-len", str(PROMPT),
      "--response-len", str(RESPONSE), "--chunk", "32", "--warmup", "1", "--iters", "2",
      "--matmul-size", "128", "--matmul-seconds", "0", "--group-size", str(ROWS),
      "--out", str(out)])
  return returned, json.loads(out.read_text())


def test_train_step_json_is_what_main_returned(train_step_run):
  returned, written = train_step_run
  assert written == json.loads(json.dumps(returned))
  assert written["benchmark"] == "train_step"
  assert len(written["machine"]["load_average_1_5_15"]) == 3
  assert len(written["machine"]["load_average_after"]) == 3
  assert written["machine"]["limits"]["read_bytes_per_s"] > 0
  assert [m["model"] for m in written["models"]] == [TINY]


def test_train_step_ratios_follow_from_reported_times(train_step_run):
  _, result = train_step_run
  model = result["models"][0]
  cases = model["cases"]
  assert set(cases) == {"grpo", "fused", "fused_idle", "grpo_shared"}
  for name, case in cases.items():
    matmul = case["matmul"]
    assert _close(matmul["flops_per_s"], 2 * 128**3 / matmul["median_s"])
    assert _close(matmul["flops_per_cpu_s"], 2 * 128**3 / matmul["cpu_median_s"])
    step = case["step"]
    assert step["iters"] == 2 and 0 < step["min_s"] <= step["median_s"] <= step["max_s"]
    assert step["cpu_median_s"] > 0 and case["compile_s"] > 0
    assert case["tokens"] == ROWS * SEQ
    assert _close(case["tokens_per_s"], case["tokens"] / step["median_s"])
    assert 0 < case["response_tokens"] <= ROWS * RESPONSE
    assert _close(case["achieved_flops_per_s"], case["model_flops"]["total"] / step["median_s"])
    assert _close(case["mfu"], case["achieved_flops_per_s"] / matmul["flops_per_s"])
    assert _close(case["mfu_cpu_time"], case["model_flops"]["total"] / step["cpu_median_s"]
                  / matmul["flops_per_cpu_s"])
    assert math.isfinite(case["final_loss"]), name
  assert _close(model["fused_over_grpo_step_time"],
                cases["fused"]["step"]["median_s"] / cases["grpo"]["step"]["median_s"])
  assert _close(model["fused_over_grpo_cpu_time"],
                cases["fused"]["step"]["cpu_median_s"] / cases["grpo"]["step"]["cpu_median_s"])
  assert _close(model["fused_idle_over_grpo_step_time"],
                cases["fused_idle"]["step"]["median_s"] / cases["grpo"]["step"]["median_s"])
  assert cases["grpo"]["step_config"]["beta"] == 0 and cases["fused"]["step_config"]["beta"] > 0
  assert cases["fused_idle"]["step_config"] == cases["fused"]["step_config"]
  assert _close(model["grpo_shared_over_grpo_step_time"],
                cases["grpo_shared"]["step"]["median_s"] / cases["grpo"]["step"]["median_s"])
  assert cases["grpo_shared"]["step_config"] == cases["grpo"]["step_config"]


def test_train_step_memory_parts_add_up(train_step_run):
  _, result = train_step_run
  # The tiny Qwen3 by hand: embedding (tied), per layer q/k/v/o, gated MLP, two norms and
  # the two QK-norms, then the final norm.
  d, f, heads, kv_heads, head_dim, vocab, layers = 128, 512, 4, 2, 32, 512, 2
  per_layer = (d * heads * head_dim * 2 + d * kv_heads * head_dim * 2 + 3 * d * f + 2 * d
               + 2 * head_dim)
  params = vocab * d + layers * per_layer + d
  for case in result["models"][0]["cases"].values():
    memory = case["memory"]
    assert memory["total_bytes"] == (memory["argument_bytes"] + memory["output_bytes"]
                                     - memory["alias_bytes"] + memory["temp_bytes"])
    # The donated state holds the parameters and Adam's two moments (float32).
    assert memory["argument_bytes"] >= 3 * 4 * params
    assert memory["alias_bytes"] >= 3 * 4 * params
    assert case["process_peak_rss_bytes"] > memory["argument_bytes"]


def test_train_step_flops_hand_worked(train_step_run):
  _, result = train_step_run
  cfg = common.model_config(TINY)
  # N_nonembed = 2 layers × (128·32·(2·4 + 2·2) + 3·128·512) = 491 520.
  assert common.nonembedding_params(cfg) == 491_520
  linear = 2 * 491_520 * ROWS * SEQ                  # 47 185 920
  attention = 4 * 2 * ROWS * SEQ**2 * 4 * 32         # 1 179 648
  unembed = 2 * 128 * 512 * ROWS * (SEQ - 1)         # 6 029 312
  assert (linear, attention, unembed) == (47_185_920, 1_179_648, 6_029_312)
  cases = result["models"][0]["cases"]
  assert cases["grpo"]["model_flops"]["total"] == 3 * (linear + attention + unembed)
  assert cases["fused"]["model_flops"]["total"] == 4 * (linear + attention + unembed)
  # No distillation token: the step skips the teacher's forward.
  assert cases["fused_idle"]["model_flops"]["total"] == 3 * (linear + attention + unembed)
  # Shared prompts: the layers ran one sequence of 8 + 2 × 16 = 40 columns, the prompt seeing
  # itself (8² pairs) and each response the prompt and itself (16 · 24 pairs); the head reads
  # the rows' columns as before.
  shared_linear = 2 * 491_520 * 40                   # 39 321 600
  shared_attention = 4 * 2 * (8**2 + 2 * 16 * 24) * 4 * 32   # 851 968
  assert cases["grpo_shared"]["model_flops"]["total"] == 3 * (shared_linear + shared_attention
                                                              + unembed)
  # XLA's count adds the rematerialised logits and elementwise work on top of ours.
  for case in cases.values():
    assert 0.95 <= case["xla_flops"] / case["model_flops"]["total"] <= 1.5


def test_grpo_batch_follows_the_tunix_recipe():
  batch = train_step_bench.grpo_batch(512, 4, 16, 32, seed=0, teacher=True)
  # The driver's draws, in its order, from the same seed.
  rng = np.random.default_rng(0)
  prompt = rng.integers(3, 512, (4, 16))
  prompt[:, :2] = 0
  response = rng.integers(3, 512, (4, 32))
  lengths = rng.integers(16, 33, (4,))
  for row, length in enumerate(lengths):
    response[row, length:] = 0
  advantages = rng.standard_normal(4)
  old = -np.abs(rng.standard_normal((4, 32))) - 5.0
  np.testing.assert_array_equal(batch["input_ids"], np.concatenate([prompt, response], 1))
  np.testing.assert_array_equal(batch["attention_mask"], batch["input_ids"] != 0)
  loss_mask = batch["loss_mask"]
  assert loss_mask[:, :16].sum() == 0
  np.testing.assert_array_equal(loss_mask[:, 16:].sum(1), lengths)
  np.testing.assert_allclose(batch["advantages"][:, 16:], advantages[:, None] * loss_mask[:, 16:],
                             rtol=1e-6)
  np.testing.assert_allclose(batch["old_logprobs"][:, 16:], old * loss_mask[:, 16:], rtol=1e-6)
  np.testing.assert_array_equal(batch["behaviour_logprobs"], batch["old_logprobs"])
  np.testing.assert_array_equal(batch["teacher_input_ids"][:, 16:], response)
  teacher_prompt = batch["teacher_input_ids"][:, :16]
  assert (teacher_prompt[:, :4] == 0).all() and (teacher_prompt[:, 4:] >= 3).all()
  np.testing.assert_array_equal(batch["distill_mask"], loss_mask)


def test_loss_memory_chunked_equals_naive_and_uses_less(tmp_path):
  out = tmp_path / "loss_memory.json"
  result = loss_memory.main([
      "--batch", "2", "--seq-len", "257", "--hidden", "16", "--vocab", "2048", "--chunk", "32",
      "--check-seq-len", "20", "--check-vocab", "100", "--check-chunk", "8",
      "--naive-run-limit-gib", "1", "--out", str(out)])
  assert json.loads(out.read_text()) == json.loads(json.dumps(result))
  check = result["check"]
  assert max(check["loss"], check["grad_unembed"], check["grad_hidden"]) < 1e-5
  chunked, naive = result["chunked"], result["naive"]
  assert chunked["ran"] and naive["ran"]
  # At the large size too, both versions compute the same loss.
  assert math.isclose(chunked["loss"], naive["loss"], rel_tol=1e-5, abs_tol=1e-6)
  assert result["full_logits_bytes"] == 2 * 256 * 2048 * 4
  # The naive version holds at least one [B, T-1, V] array; the chunked one never does.
  assert naive["temp_bytes"] >= result["full_logits_bytes"] > chunked["temp_bytes"]
  assert _close(result["naive_over_chunked_temp"], naive["temp_bytes"] / chunked["temp_bytes"])
  assert _close(result["naive_over_chunked_total"],
                naive["total_bytes"] / chunked["total_bytes"])
  assert result["naive_over_chunked_temp"] > 2


def test_loss_memory_reports_a_naive_version_it_does_not_run(tmp_path):
  result = loss_memory.main([
      "--batch", "1", "--seq-len", "64", "--hidden", "8", "--vocab", "512", "--chunk", "16",
      "--check-seq-len", "8", "--check-vocab", "32", "--check-chunk", "4",
      "--naive-run-limit-gib", "0", "--out", str(tmp_path / "lm.json")])
  assert result["chunked"]["ran"] and not result["naive"]["ran"]
  assert "run limit" in result["naive"]["not_run_because"]
  assert result["naive"]["temp_bytes"] > 0


def test_scan_compile_ratios_follow_from_reported_times(tmp_path):
  out = tmp_path / "scan_compile.json"
  result = scan_compile.main(["--layers", "1,2", "--batch", "1", "--prompt-len", "4",
                              "--response-len", "12", "--chunk", "16", "--out", str(out)])
  assert json.loads(out.read_text()) == json.loads(json.dumps(result))
  assert result["benchmark"] == "scan_compile"
  assert [d["layers"] for d in result["depths"]] == [1, 2]
  for depth in result["depths"]:
    unrolled, scanned = depth["unrolled"], depth["scanned"]
    assert _close(depth["scanned_over_unrolled_compile"],
                  scanned["compile_s"] / unrolled["compile_s"])
    assert _close(depth["scanned_over_unrolled_temp"],
                  scanned["memory"]["temp_bytes"] / unrolled["memory"]["temp_bytes"])
    # Same weights, same batch: the one step each side ran gives the same loss.
    assert math.isfinite(unrolled["loss"])
    assert math.isclose(scanned["loss"], unrolled["loss"], rel_tol=1e-4)
    for side in (unrolled, scanned):
      memory = side["memory"]
      assert memory["total_bytes"] == (memory["argument_bytes"] + memory["output_bytes"]
                                       - memory["alias_bytes"] + memory["temp_bytes"])
  # The parameters (and Adam's moments) of the 2-layer model outweigh the 1-layer one's.
  args_1, args_2 = (d["unrolled"]["memory"]["argument_bytes"] for d in result["depths"])
  d, f, heads, kv_heads, head_dim = 128, 512, 4, 2, 32
  per_layer = (d * heads * head_dim * 2 + d * kv_heads * head_dim * 2 + 3 * d * f + 2 * d
               + 2 * head_dim)
  assert args_2 - args_1 == 3 * 4 * per_layer
  for depth in result["depths"]:
    assert depth["scanned"]["memory"]["argument_bytes"] == depth["unrolled"]["memory"][
        "argument_bytes"]
  ratios = result["deep_over_shallow_compile"]
  for side in ("unrolled", "scanned"):
    assert _close(ratios[side], result["depths"][1][side]["compile_s"]
                  / result["depths"][0][side]["compile_s"])
  assert result["target"]["met"] == (ratios["scanned"] <= 1.5)


@pytest.mark.parametrize("module, argv, message", [
    (train_step_bench, ["--models", "qwen9"], "--models"),
    (train_step_bench, ["--response-len", "1"], "--response-len must be >= 2"),
    (loss_memory, ["--chunk", "0"], "--chunk must be >= 1"),
    (vs_tunix, ["--driver", "/nonexistent/tunix_grpo_bench.py"], "--driver"),
    (vs_tunix, ["--configs", "qwen3-9l"], "--configs"),
    (scan_compile, ["--layers", "12,4"], "--layers needs at least two depths"),
    (dot_precision, ["--shapes", "q:2x3"], "--shapes: 'q:2x3' is not NAME:ROWSxINxOUT"),
    (dot_precision, ["--rounds", "0"], "--rounds must be >= 1"),
    (decode_profile, ["--new-tokens", "1"], "--new-tokens must be >= 2"),
    (decode_profile, ["--model", TINY],
     "--model qwen3-2l-d128: a layer's output width equals the vocabulary (512)"),
])
def test_bad_arguments_are_named(module, argv, message, capsys):
  with pytest.raises(SystemExit):
    module.main(argv)
  assert message in capsys.readouterr().err


def test_tunix_venv_with_another_jax_is_refused(tmp_path):
  python = tmp_path / "bin" / "python"
  python.parent.mkdir()
  python.write_text("#!/bin/sh\necho '{\"google-tunix\": \"0.1.7\", \"jax\": \"0.4.1\", "
                    "\"jaxlib\": \"0.4.1\", \"flax\": \"0.1\", \"optax\": \"0.1\"}'\n")
  python.chmod(0o755)
  with pytest.raises(RuntimeError, match="jax 0.4.1"):
    vs_tunix.ensure_venv(tmp_path)


@pytest.mark.skipif(not vs_tunix.venv_python(vs_tunix.DEFAULT_VENV).exists()
                    or not vs_tunix.DEFAULT_DRIVER.is_file(),
                    reason="needs .venv-tunix (created by benchmarks/vs_tunix.py) and the driver")
def test_vs_tunix_ratio_follows_from_reported_times(tmp_path):
  out = tmp_path / "vs_tunix.json"
  result = vs_tunix.main([
      "--configs", TINY, "--batch", str(ROWS), "--prompt-len", str(PROMPT),
      "--response-len", str(RESPONSE), "--chunk", "32", "--warmup", "1", "--iters", "2",
      "--rounds", "2", "--matmul-size", "128", "--matmul-seconds", "0", "--out", str(out)])
  assert json.loads(out.read_text()) == json.loads(json.dumps(result))
  assert result["tunix_venv"]["jax"] == result["machine"]["jax"]
  (config,) = result["configs"]
  rounds = config["rounds"]
  assert [r["order"] for r in rounds] == [["tunix", "ours"], ["ours", "tunix"]]
  tunix = [r["tunix"]["median_s"] for r in rounds]
  ours = [r["ours"]["step"]["median_s"] for r in rounds]
  assert _close(config["tunix_step_s"], np.mean(tunix))   # the median of two
  assert _close(config["ours_step_s"], np.mean(ours))
  assert _close(config["ours_cpu_step_s"],
                np.mean([r["ours"]["step"]["cpu_median_s"] for r in rounds]))
  assert _close(config["speedup_ours_over_tunix"], config["tunix_step_s"] / config["ours_step_s"])
  # Each round's own ratio; two values give [min, max], which covers the median with ½.
  per_round = [t / o for t, o in zip(tunix, ours)]
  assert np.allclose(config["speedup_per_round"], per_round)
  assert config["speedup_per_round_median"] == pytest.approx(
      {"median": np.mean(per_round), "low": min(per_round), "high": max(per_round),
       "coverage": 0.5})
  assert config["tokens_per_step"] == ROWS * SEQ
  assert _close(config["ours_tokens_per_s"], ROWS * SEQ / config["ours_step_s"])
  assert _close(config["tunix_tokens_per_s"], ROWS * SEQ / config["tunix_step_s"])
  # Both sides ran the same architecture: the same number of parameters.
  d, f, vocab = 128, 512, 512
  per_layer = d * 4 * 32 * 2 + d * 2 * 32 * 2 + 3 * d * f + 2 * d + 2 * 32
  for round_ in rounds:
    assert round_["tunix"]["n_params"] == vocab * d + 2 * per_layer + d
    assert math.isfinite(round_["ours"]["final_loss"])


# ----------------------------------------------------------------------------- e2e.py

E2E_PROMPTS, E2E_G, E2E_C = 1, 2, 8


@pytest.fixture(scope="module")
def e2e_run(tmp_path_factory):
  """One timed iteration of each part (warm-up 0: it compiles too; no time is asserted)."""
  from tests.helpers import model_utils as mu  # noqa: PLC0415 - the repo root is on the path
  from benchmarks import e2e  # noqa: PLC0415
  out = tmp_path_factory.mktemp("bench") / "e2e.json"
  argv = ["--prompts", str(E2E_PROMPTS), "--group-size", str(E2E_G), "--prompt-len", "8",
          "--completion-len", str(E2E_C), "--warmup", "0", "--iters", "1",
          "--envs", "frozenlake", "--pool-groups", "2", "--batch-groups", "1",
          "--rounds", "2", "--out", str(out)]
  if not vs_tunix.venv_python(vs_tunix.DEFAULT_VENV).exists():
    argv.append("--skip-tunix")
  returned = e2e.main(argv, tokenizer=mu.tiny_tokenizer())
  return returned, json.loads(out.read_text())


def test_e2e_json_rates_and_shares_follow_from_its_times(e2e_run):
  returned, written = e2e_run
  assert written["ours_common"] == json.loads(json.dumps(returned["ours_common"]))
  for name in ("tunix", "ours_common", "ours_agentic"):
    if name not in written:
      continue
    part = written[name]
    assert _close(part["trained_tokens_per_s"],
                  part["trained_tokens_per_iteration"] / part["iteration_s"])
    assert _close(sum(part["stage_share"].values()), 1.0)
    assert _close(part["iteration_s"], sum(part["stage_s"].values()))   # one iteration
  # Single-turn work without a stop token: every completion has exactly C trained tokens.
  assert written["ours_common"]["trained_tokens_per_iteration"] == E2E_PROMPTS * E2E_G * E2E_C
  if "tunix" in written:   # each round's pair gives its own ratio; n = 2: [min, max], ½
    per_round = [ours["trained_tokens_per_s"] / tunix["trained_tokens_per_s"] for ours, tunix
                 in zip(written["ours_common"]["rounds"], written["tunix"]["rounds"])]
    assert len(per_round) == 2 and np.allclose(written["ratio_per_round"], per_round)
    assert written["ratio_per_round_median"] == pytest.approx(
        {"median": np.mean(per_round), "low": min(per_round), "high": max(per_round),
         "coverage": 0.5})
  if "tunix" in written:
    assert set(written["tunix"]["stage_s"]) == {"rollout", "update", "other"}
  assert set(written["ours_agentic"]["stage_s"]) == {
      "rollout", "judge", "advantages", "select", "teacher", "batch", "step", "sync"}
  assert written["ours_agentic"]["trained_tokens_per_iteration"] > 0


def test_tunix_iterations_are_the_loop_s_wall_time():
  from benchmarks import e2e  # noqa: PLC0415
  record = {"generate_s": [2.5, 0.1, 0.09], "update_actor_s": [4.0, 0.15, 0.16],
            "mark_intervals_s": [6.6, 0.2561, 0.2555]}
  iterations = e2e.tunix_iterations(record, warmup=1)
  assert [sorted(it) for it in iterations] == [["other", "rollout", "update"]] * 2
  assert [it["rollout"] for it in iterations] == [0.1, 0.09]
  assert [it["update"] for it in iterations] == [0.15, 0.16]
  assert np.allclose([it["other"] for it in iterations], [0.0061, 0.0055])
  record["mark_intervals_s"][2] = 0.2   # shorter than its own generate + update
  with pytest.raises(RuntimeError, match="one step's prompts at a time"):
    e2e.tunix_iterations(record, warmup=1)


def test_e2e_limit_fractions_follow_from_the_probe(e2e_run):
  _, written = e2e_run
  machine = written["machine"]
  limits = machine["limits"]
  assert len(limits["load_average_before"]) == len(machine["load_average_after"]) == 3
  assert limits["matmul_flops_per_s"] > 0 and limits["read_bytes_per_s"] > 0
  for name in ("tunix", "ours_common"):
    if name not in written:
      continue
    part, fractions = written[name], written[name]["limit_fractions"]
    update = part["stage_s"].get("step", part["stage_s"].get("update"))
    assert _close(fractions["rollout_of_bandwidth_bound"], fractions["decode_read_bytes"]
                  / part["stage_s"]["rollout"] / limits["read_bytes_per_s"])
    assert _close(fractions["step_of_matmul_rate"],
                  fractions["step_model_flops"] / update / limits["matmul_flops_per_s"])
  ours = written["ours_common"]
  assert limits["seconds_per_kernel"] > 0 and ours["decode_kernels_per_step"] > 0
  # Token 0 comes from the prefill: C - 1 decode steps, each launching the counted kernels.
  assert _close(ours["limit_fractions"]["rollout_of_dispatch_bound"],
                (E2E_C - 1) * ours["decode_kernels_per_step"] * limits["seconds_per_kernel"]
                / ours["stage_s"]["rollout"])
  assert _close(ours["limit_fractions"]["rollout_s_per_decode_kernel"],
                ours["stage_s"]["rollout"] / ((E2E_C - 1) * ours["decode_kernels_per_step"]))
  agentic = written["ours_agentic"]
  (work,) = agentic["step_work"]   # one timed iteration
  assert _close(agentic["step_mfu"],
                work["tflops"] * 1e12 / work["compute_s"] / limits["matmul_flops_per_s"])
  assert _close(agentic["step_trained_tokens_per_s"], work["trained_tokens"] / work["compute_s"])


HAND_WRITTEN_LOOP = """HloModule loop

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %y = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused
  %b = f32[2,4]{1,0} bitcast(%y)
  %z = f32[8]{0} copy(%y)
  ROOT %t = (s32[], f32[8]{0}) tuple(%next, %z)
}

ENTRY %main (a: f32[8]) -> (s32[], f32[8]) {
  %a = f32[8]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(%zero, %a)
  ROOT %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body
}
"""


def test_rollout_call_limits_by_hand():
  """SmolLM2-135M's layer matmuls: d = 576, 9 query and 3 KV heads of 64, MLP 1536, 30 layers:
  30 · (576 · 64 · (2·9 + 2·3) + 3 · 576 · 1536) = 106,168,320 weights, 2 FLOPs each a token."""
  cfg = sampler.SMOLLM2_CONFIG
  flops_per_token = 2 * 106_168_320
  limits = {"matmul_flops_per_s": 1e11, "read_bytes_per_s": 2e10}
  totals = {"prefill_shared_s": 4.0, "prefill_shared_tokens": 1536, "decode_s": 9.0,
            "decode_iterations": 45, "decode_row_iterations": 720}
  fractions = sampler.rollout_call_limits(totals, cfg, 538_000_000, limits)
  assert math.isclose(fractions["prefill_shared_of_matmul_rate"],
                      flops_per_token * 1536 / 1e11 / 4.0)
  # Weights read 45 times: 1.2105 s; matmuls for 720 row-steps: 1.5288 s, the larger.
  assert math.isclose(fractions["decode_of_bound"], flops_per_token * 720 / 1e11 / 9.0)
  assert math.isclose(fractions["decode_s_per_iteration"], 9.0 / 45)
  assert "prefill_window_of_matmul_rate" not in fractions   # no such call was made


def test_while_body_kernels_counts_the_loop_body_by_hand():
  # The body launches add, fusion and copy; parameters, tuples, bitcasts and constants are
  # no kernels, and the condition is not the body.
  assert common.while_body_kernels(HAND_WRITTEN_LOOP) == 3
  with pytest.raises(ValueError, match="no while loop"):
    common.while_body_kernels(HAND_WRITTEN_LOOP.replace("while(", "call("))


def test_e2e_plain_jax_step_ran_beside_ours_on_the_same_work(e2e_run):
  _, written = e2e_run
  ours, plain = written["ours_common"], written["ours_common"]["plain_jax_step"]
  # --warmup 0 --iters 1 --rounds 2: one timed plain step a round, beside that round's step.
  assert len(plain["steps_s"]) == len(plain["agreement"]) == 2
  assert np.allclose(plain["ours_over_plain_per_round"],
                     [r["stage_s"]["step"] / t for r, t in zip(ours["rounds"], plain["steps_s"])])
  assert _close(plain["step_s"], float(np.median(plain["steps_s"])))
  assert _close(plain["ours_over_plain"], float(np.median(plain["ours_over_plain_per_round"])))
  for check in plain["agreement"]:   # a nonzero gradient, the same in both
    assert check["grad_norm"] > 0
    assert math.isclose(check["grad_norm"], check["plain_grad_norm"], rel_tol=1e-3)
    assert math.isclose(check["loss"], check["plain_loss"], rel_tol=1e-4, abs_tol=1e-6)


def test_plain_jax_step_loss_equals_numpy_grpo_by_hand():
  """The peer's loss against numpy on the model's own logits: the clipped surrogate at the
  batch's π_old, per-sequence token mean over the loss mask, mean over non-empty rows."""
  from benchmarks.peers.plain_jax_step import PlainGRPOStep  # noqa: PLC0415
  from rised_jax.model import from_config  # noqa: PLC0415
  cfg = common.model_config(TINY)
  model = from_config(cfg, 0)
  rng = np.random.default_rng(3)
  ids = rng.integers(3, cfg.vocab_size, (3, 10)).astype(np.int32)
  loss_mask = np.zeros((3, 10), np.float32)
  loss_mask[0, 4:10] = 1.0
  loss_mask[1, 6:8] = 1.0   # row 2 has no loss token: it counts in neither mean
  advantages = np.array([[1.5], [-0.7], [2.0]], np.float32) * loss_mask
  # log π ≈ -log V ≈ -6.2: row 0's ratios ≈ 2 meet the upper clip with A > 0, row 1's ≈ 0.3
  # the lower one with A < 0.
  offset = np.array([[-7.0], [-5.0], [-5.0]])
  old = np.where(loss_mask > 0, offset - 0.1 * np.abs(rng.normal(size=(3, 10))), 0.0
                 ).astype(np.float32)
  batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "loss_mask": loss_mask,
           "advantages": advantages, "old_logprobs": old}
  plain = PlainGRPOStep(model, learning_rate=1e-4, weight_decay=0.0, eps_low=0.2, eps_high=0.3)
  logits = np.asarray(model(ids, np.ones_like(ids)), np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  expected = []
  for row in range(2):
    terms = []
    for t in np.flatnonzero(loss_mask[row]):
      ratio = math.exp(logp[row, t - 1, ids[row, t]] - old[row, t])
      adv = advantages[row, t]
      terms.append(-min(ratio * adv, min(max(ratio, 0.8), 1.3) * adv))
    expected.append(np.mean(terms))
  assert float(plain.loss(plain.params(model), batch)) == pytest.approx(np.mean(expected),
                                                                        rel=1e-5)


def test_e2e_refuses_a_plain_step_that_did_other_work():
  from benchmarks import e2e  # noqa: PLC0415
  metrics = {"loss": 0.25, "grad_norm": 2.0}
  assert e2e.plain_agreement(metrics, 0.25, 2.0 * (1 + 1e-5), 0)["plain_grad_norm"] > 2.0
  with pytest.raises(RuntimeError, match="iteration 3: the plain JAX step computed loss 0.25 "
                     "and gradient norm 2.1"):
    e2e.plain_agreement(metrics, 0.25, 2.1, 3)
  with pytest.raises(RuntimeError, match="loss 0.3 "):
    e2e.plain_agreement(metrics, 0.3, 2.0, 0)


def test_e2e_ratio_follows_from_reported_rates(e2e_run):
  _, written = e2e_run
  if "tunix" not in written:
    pytest.skip(f"{vs_tunix.DEFAULT_VENV} is missing (benchmarks/vs_tunix.py creates it): the "
                "tunix half of e2e.py was skipped")
  assert written["tunix"]["trained_tokens_per_iteration"] == E2E_PROMPTS * E2E_G * E2E_C
  assert _close(written["ratio_ours_common_over_tunix"],
                written["ours_common"]["trained_tokens_per_s"] /
                written["tunix"]["trained_tokens_per_s"])


# ----------------------------------------------------------------------------- main_job_changes.py

MJC_TASKS, MJC_G = 2, 2   # one step of K = 2 groups of G = 2 rollouts
MJC_ENVS = ["frozenlake", "maze"]   # tiny_cpu.py's, one eval episode each


@pytest.fixture(scope="module")
def main_job_changes_run(tmp_path_factory):
  """(a) every change off and (e) every change on, on the tiny config (no time is asserted)."""
  from benchmarks import main_job_changes  # noqa: PLC0415
  from rised_jax.model import tiny  # noqa: PLC0415
  root = tmp_path_factory.mktemp("main_job_changes")
  model = tiny.write(root / "model", MJC_ENVS)
  out = root / "main_job_changes.json"
  returned = main_job_changes.main([
      "--config", f"{common.REPO_ROOT / 'experiments' / 'configs' / 'tiny_cpu.py'}:rised",
      "--steps", "1", "--eval-episodes", "1", "--only", "a,e", "--keep", str(root / "runs"),
      "--set", f"model.source={model}",
      # Two-turn episodes: a second turn for prefix reuse, fewer prompt shapes to compile.
      "--set", "envs.difficulty.frozenlake={'size': 3, 'holes': 0, 'min_distance': 2, "
      "'max_turns': 2}",
      "--set", "envs.difficulty.maze={'width': 2, 'height': 2, 'min_distance': 1, 'max_turns': 2}",
      "--set", f"rollout.group_size={MJC_G}", "--set", f"select.pool_groups={MJC_TASKS}",
      "--set", "select.batch_groups=1", "--out", str(out)])
  return returned, json.loads(out.read_text()), root / "runs"


def test_main_job_changes_stage_times_are_the_logged_ones(main_job_changes_run):
  returned, written, runs = main_job_changes_run
  assert written == json.loads(json.dumps(returned))
  for row in written["configurations"]:
    logged: dict[str, float] = {}
    for line in (runs / row["name"] / "metrics.jsonl").read_text().splitlines():
      for key, value in json.loads(line).items():
        if key.startswith("time/"):
          logged[key[5:]] = logged.get(key[5:], 0.0) + value
    stages = dict(row["stage_s"])
    other = stages.pop("other")
    assert stages.keys() == logged.keys() and all(_close(stages[k], logged[k]) for k in logged)
    assert {"rollout", "step", "sync", "eval"} <= set(stages)
    assert _close(other, row["train_s"] - sum(logged.values()))
    assert _close(sum(row["stage_share"].values()), 1.0)
    assert _close(row["ratio_to_first"]["train_s"],
                  row["train_s"] / written["configurations"][0]["train_s"])
    saved = json.loads((runs / row["name"] / "config.json").read_text())   # what the run used
    assert saved["train"]["steps"] == 1 and saved["envs"]["names"] == MJC_ENVS
    for key in ("rollout.reuse_prefix", "model.scan_layers", "rollout.decode_chunk"):
      section, name = key.split(".")
      assert saved[section][name] == row["settings"][key]


def test_main_job_changes_switches_take_effect_and_change_no_rollout(main_job_changes_run):
  _, written, _ = main_job_changes_run
  off, on = written["configurations"]
  assert [off["name"], on["name"]] == ["a", "e"]
  assert off["settings"] == {"rollout.reuse_prefix": False, "model.scan_layers": False,
                             "shared_prefill": False, "rollout.decode_chunk": 0}
  assert on["settings"] == {"rollout.reuse_prefix": True, "model.scan_layers": True,
                            "shared_prefill": True, "rollout.decode_chunk": 4}
  # Off: no prompt token is shared or reused; on: both happen (G = 2 rows share a first prompt).
  assert off["engine_work"]["shared_tokens"] == off["engine_work"]["reused_tokens"] == 0
  assert on["engine_work"]["shared_tokens"] > 0 and on["engine_work"]["reused_tokens"] > 0
  # The changes compute the same tokens: every rollout and evaluation episode is the same.
  same = on["vs_previous"]
  assert same["rollouts"] == {"same": True, "records": [MJC_TASKS * MJC_G] * 2, "differing": 0,
                              "first_differing_step": None}
  assert same["eval_episodes"]["same"]
  assert same["eval_episodes"]["records"] == [2 * len(MJC_ENVS)] * 2   # 2 evaluations
  assert not off["shipped"] and not on["shipped"]   # tiny_cpu.py ships neither


def test_main_job_changes_marks_the_smollm2_config_and_reports_differences():
  from benchmarks import main_job_changes as mjc  # noqa: PLC0415
  shipped = mjc.shipped_settings(mjc.load_config(str(mjc.DEFAULT_CONFIG)))
  rows = mjc.configurations(4)
  assert [r["name"] for r in rows if r["settings"] == shipped] == ["d"]
  before = {"rollouts": [[1, "maze", 7, 0, 0, 2, 5, ["a", "b"], 0.0],
                         [2, "maze", 8, 0, 0, 1, 3, ["c"], 1.0]], "eval_episodes": []}
  now = {"rollouts": [before["rollouts"][0], [2, "maze", 8, 0, 0, 1, 3, ["d"], 1.0]],
         "eval_episodes": []}
  compared = mjc.compare_runs(now, before)
  assert not compared["same"]
  assert compared["rollouts"] == {"same": False, "records": [2, 2], "differing": 1,
                                  "first_differing_step": 2}


@pytest.mark.parametrize("argv, message", [
    (["--only", "a,z"], "--only: unknown configurations ['z']"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--set", "train.steps"], "expected KEY=VALUE"),
    (["--config", "/nonexistent.py"], "--config /nonexistent.py: no such file"),
])
def test_main_job_changes_bad_arguments_are_named(argv, message, capsys):
  from benchmarks import main_job_changes  # noqa: PLC0415
  with pytest.raises(SystemExit):
    main_job_changes.main(argv)
  assert message in capsys.readouterr().err


def test_plan_table_hand_checked(tmp_path):
  """benchmarks/plan.py runs on the shipped paper configs; Qwen3-4B's parameter count and
  the v5p-64 state per chip worked by hand."""
  from benchmarks import plan  # noqa: PLC0415
  out = tmp_path / "plan.json"
  plan.main(["--out", str(out)])
  rows = {row["config"]: row for row in json.loads(out.read_text())["configs"]}
  assert set(rows) == {"RISED Qwen3-4B", "RISED Qwen3-1.7B", "CriPO Qwen3-4B",
                       "CriPO Qwen3-1.7B"}
  # 36 × (2560·128·(2·32 + 2·8) + 3·2560·9728 + 2·2560 + 2·128) + 151 936·2560 + 2560: the
  # 4,022,468,096 parameters Qwen3-4B's model card states.
  rised = rows["RISED Qwen3-4B"]
  assert rised["params"] == 4_022_468_096
  v5p = rised["machines"]["TPU v5p-64"]
  assert v5p["chips"] == 32
  assert v5p["state_gb_per_chip"] == pytest.approx(4_022_468_096 * 14 / 32 / 1e9)


def test_dot_precision_ratios_follow_from_times_and_forms_round_as_named(tmp_path):
  out = tmp_path / "dot.json"
  result = dot_precision.main(["--shapes", "a:8x16x24", "b:3x40x5", "--rounds", "3",
                               "--repeats", "1", "--out", str(out)])
  assert json.loads(out.read_text()) == json.loads(json.dumps(result))   # tuples → lists
  assert result["machine"]["limits"]["matmul_flops_per_s"] > 0
  assert [(s["name"], s["rows"], s["in"], s["out"]) for s in result["shapes"]] == [
      ("a", 8, 16, 24), ("b", 3, 40, 5)]
  for shape in result["shapes"]:
    forms = shape["forms"]
    assert set(forms) == set(dot_precision.FORMS)
    for form in forms.values():
      assert len(form["rounds_s"]) == 3
      assert _close(form["median_s"], float(np.median(form["rounds_s"])))
      assert _close(form["f32_over_form"], forms["f32"]["median_s"] / form["median_s"])
      assert _close(form["flops_per_s"], 2 * shape["rows"] * shape["in"] * shape["out"]
                    / form["median_s"])
    elementwise = shape["elementwise"]
    assert _close(shape["silu_mul_f32_over_bf16"], elementwise["silu_mul_f32"]["median_s"]
                  / elementwise["silu_mul_bf16"]["median_s"])


def test_dot_precision_forms_against_numpy_by_hand():
  """A bfloat16 form must round its operands (its product differs from float32's by more
  than its tolerance), and a form that computes another product is refused."""
  rng = np.random.default_rng(1)
  x, w, g = (rng.standard_normal(shape, np.float32) for shape in ((16, 64), (64, 32), (16, 32)))
  calls = dot_precision.form_calls(x, w, g)
  errors = dot_precision.check_values(calls)
  exact = x.astype(np.float64) @ w.astype(np.float64)
  for form in ("bf16_acc32", "cast_acc32"):
    got = np.asarray(calls[form][0](), np.float64)
    assert np.max(np.abs(got - exact)) / np.max(np.abs(exact)) > dot_precision.TOLERANCE[form]
    assert errors[form] <= dot_precision.TOLERANCE[form]
  np.testing.assert_allclose(np.asarray(calls["wgrad_acc32"][0]()),
                             x.astype(np.float64).T @ g.astype(np.float64), rtol=0.05, atol=0.1)
  wrong = {"f32": (calls["f32"][0], exact[:, ::-1].copy())}   # columns swapped
  with pytest.raises(AssertionError, match="f32: relative error"):
    dot_precision.check_values(wrong)


@pytest.mark.parametrize("layers", ["scanned", "unrolled"])
def test_decode_profile_parts_count_the_model_s_kernels_and_bytes(layers, tmp_path):
  """Each part's launches per decode step are the model's own count (7 dense-layer dots and 2
  attention einsums per layer, one head, each layer's K and V written; K and V copied out of
  the stacked cache and weight slices only when the layers are scanned, since unrolled layers
  keep their own cache arrays), its bytes the hand-counted parameters and cache, and the
  derived figures follow from the reported ones."""
  out = tmp_path / "decode_profile.json"
  rows, prompt_len, new_tokens = 2, 8, 4
  model = "qwen3-4l-d256"   # the 2-layer preset's MLP is as wide as its vocabulary (refused)
  result = decode_profile.main([
      "--model", model, "--rows", str(rows), "--prompt-len", str(prompt_len),
      "--new-tokens", str(new_tokens), "--layers", layers, "--repeats", "1",
      "--matmul-size", "128", "--matmul-seconds", "0", "--out", str(out)])
  assert json.loads(out.read_text()) == json.loads(json.dumps(result))
  hf = common.MODEL_PRESETS[model]
  n_layers, d, f, vocab = (hf["num_hidden_layers"], hf["hidden_size"], hf["intermediate_size"],
                           hf["vocab_size"])
  heads, kv_heads, hd = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
  parts = result["parts"]
  launches = {part: row["launches_per_step"] for part, row in parts.items()}
  assert launches["weight dots"] == 7 * n_layers
  assert launches["attention dots"] == 2 * n_layers
  assert launches["head"] == 1
  assert launches["cache slices"] == (2 * n_layers if layers == "scanned" else 0)
  assert launches["cache writes"] == 2 * n_layers
  assert (launches["weight slices"] > 0) == (layers == "scanned")
  # Bytes by hand: q, k, v, o, gate, up, down and the four norms (Qwen3's q and k norms).
  per_layer = d * heads * hd + 2 * d * kv_heads * hd + heads * hd * d + 3 * d * f + 2 * d + 2 * hd
  assert parts["weight dots"]["read_bytes"] == 4 * n_layers * per_layer
  assert parts["head"]["read_bytes"] == 4 * vocab * d   # tied: the embedding
  # Decode steps 1 .. 3 attend over 9 .. 11 filled slots (the prefill drew token 0): 10 on average.
  filled = np.mean([prompt_len + j for j in range(1, new_tokens)])
  assert _close(parts["attention dots"]["read_bytes"],
                4 * 2 * n_layers * rows * kv_heads * hd * filled)
  rate = result["machine"]["limits"]["read_bytes_per_s"]
  for row in parts.values():
    assert _close(row["bound_s"], row["read_bytes"] / rate)
    assert _close(row["share"], row["profiled_s"] / result["profiled_step_s"])
  assert _close(result["bandwidth_bound_s"], sum(row["bound_s"] for row in parts.values()))
  assert _close(result["profiled_step_s"], sum(row["profiled_s"] for row in parts.values()))
  times = result["generate_s"]
  assert _close(result["decode_step_s"],
                (times[str(new_tokens)][0] - times["1"][0]) / (new_tokens - 1))
  assert _close(result["bound_over_step"], result["bandwidth_bound_s"] / result["decode_step_s"])
