"""One RL iteration end to end, ours and google-tunix 0.1.7's GRPO learner loop, in one run.

  JAX_PLATFORMS=cpu python3 benchmarks/e2e.py        # → benchmarks/results/e2e.json (≈ 5 min)
  JAX_PLATFORMS=cpu python3 benchmarks/e2e.py --rounds 5   # the published figure (≈ 12 min)

With --rounds R the tunix / ours-common pair is measured R times, alternating which side goes
first; each side's figures are the median over rounds of its per-round medians (as
vs_tunix.py --rounds), and every round is kept in the JSON. Each round's own ratio (its pair
ran back to back) is kept too, with their median and its order-statistic interval
(`stats.median_interval`; at R = 5 the interval is [min, max], coverage 0.9375). The agentic
part runs once.

Three measurements on the random tiny Qwen3 of the tunix driver (2 layers, d = 128, tied,
fp32), each: --warmup iterations (they compile), then --iters timed ones, stage by stage:

  tunix        the driver `benchmarks/peers/tunix_grpo_bench.py learner` in `.venv-tunix`
               (vs_tunix.py creates it): tunix's GRPOLearner / RLCluster loop, its vanilla
               KV-cache sampler; per step --prompts random prompts of --prompt-len tokens,
               --group-size completions each of exactly --completion-len tokens (no stop
               token), a reward = fraction of even token ids, GRPO advantages, one actor
               update (β = 0, ε = 0.2, AdamW 1e-4), weights shared with the sampler. Its
               iteration is the loop's wall time from one step's prompts to the next's, as
               ours is; its stages are the driver's generate and update_actor, and `other`
               the rest of the loop (rewards, advantages, tokenising, bookkeeping).
  ours-common  the same work in this process: JaxEngine samples the same counts of random
               prompts / completions (temperature 0.9, no stop token), the same reward,
               `advantages.grpo`, every group trained (no selection), our GRPO step
               (seq-mean-token-mean, ε = 0.2, β = 0, the sampler's log-probs as π_old, AdamW
               1e-4, vs_tunix.py's settings), then `update_weights` (the weight sync).
               Beside the step, outside the iteration's time: the plain JAX step of the same
               loss (peers/plain_jax_step.py) on the same batch and weights, its loss and
               gradient norm checked against ours (`plain_jax_step`: ours / plain per round).
  ours-agentic what tunix's loop does not do: RISED on multi-turn environments through the
               trainer's own stages (`trainer.assemble / update / sync_weights`, the
               pipeline's roll_out, judge, advantages, select, teach) with the main job's
               rollout settings (experiments/configs/smollm2_cpu.py: reply prefix, stop
               string, prefix reuse, K = --pool-groups tasks × G, B = --batch-groups), the
               SmolLM2 tokenizer and a random Qwen3 of the same shape over its vocabulary.

Reported: trained agent tokens per second of wall time (tokens with loss_mask 1 in the trained
batch, per iteration), each stage's share of the iteration, and ours-common / tunix. The
machine's limits are probed in this process first (`common.probe_machine`: fp32 matmul rate,
read bandwidth, load average before; the load after is recorded too), and each part's stages
are given as fractions of them (`limit_fraction`): the rollout's decode against the
bandwidth bound (`flops.decode_read_bytes`: weights + the filled KV cache read per decode
step), and against the kernel-launch floor (our decode loop's kernels per step, counted in
its compiled program, × the probed cost of launching an empty kernel: a loose floor, since a
decode kernel's work costs far more than its launch; `rollout_s_per_decode_kernel` gives the
rollout's seconds per decode kernel beside it), the step's model FLOPs
(`flops.train_step_flops`) against the matmul rate. The agentic
step reports its MFU (model FLOPs with the vocabulary head over the columns the loss reads,
as the step runs it, over its compile-free time, against the probed rate; the trainer's
padded-batch count is beside it) and trained tokens per second of that time. On a shared 2-core
machine read every figure with the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import common, vs_tunix  # noqa: E402
from benchmarks.peers.plain_jax_step import PlainGRPOStep  # noqa: E402
from rised_jax import config as config_lib, parallel, pipelines, trainer  # noqa: E402
from rised_jax.learn import advantages as advantages_lib, batching  # noqa: E402
from rised_jax.learn import flops, train_step as step_lib  # noqa: E402
from rised_jax.model import ModelConfig, from_config, from_pretrained  # noqa: E402
from rised_jax.pipelines import stages  # noqa: E402
from rised_jax.rollout.base import GenerationRequest, SamplingParams  # noqa: E402
from rised_jax.rollout.jax_engine import JaxEngine  # noqa: E402

PRESET = "qwen3-2l-d128"
MAIN_JOB_CONFIG = common.REPO_ROOT / "experiments" / "configs" / "smollm2_cpu.py"
AGENTIC_STAGES = ("rollout", "judge", "advantages", "select", "teacher", "batch", "step", "sync")


class StageTimer:
  """Wall seconds per named stage of one iteration."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
    return out


def single_turn_limits(part: dict[str, Any], args: argparse.Namespace,
                       limits: dict[str, Any]) -> dict[str, float]:
  """The single-turn work's stages as fractions of the machine's limits (same work on both
  sides, so the same bytes and FLOPs): rollout = decode bytes / bandwidth / rollout seconds,
  step = model FLOPs / matmul rate / step seconds."""
  cfg = common.model_config(PRESET)
  rows = args.prompts * args.group_size
  weights = sum(x.size for x in jax.tree.leaves(
      nnx.state(from_config(cfg, 0), nnx.Param))) * 4   # float32
  decode = common.decode_read_bytes(cfg, weights, rows, args.prompt_len, args.completion_len, 4)
  # The FLOPs each side's step ran: ours with shared prefixes runs a group's prompt once.
  columns = args.prompt_len + args.completion_len
  shapes = {"input_ids": np.empty((rows, columns))}
  if "decode_kernels_per_step" in part and args.shared_prefix:
    shapes["prefix_ids"] = np.empty((args.prompts, args.prompt_len))
  step = common.train_step_flops(cfg, rows, columns,
                                 student_layout=flops.student_layout_of(shapes))["total"]
  stages = part["stage_s"]
  update = stages["step"] if "step" in stages else stages["update"]
  dispatch = {}
  if "decode_kernels_per_step" in part:   # ours: the kernels its decode loop launches
    # Token 0 comes from the prefill; each later token is one decode step. The launch floor
    # (kernels × an empty kernel's cost) is far below the rollout: what the kernels do, not
    # their launches, sets its time. The rollout's seconds per decode kernel say how far.
    kernels = (args.completion_len - 1) * part["decode_kernels_per_step"]
    dispatch = {"decode_kernel_launch_s": kernels * limits["seconds_per_kernel"],
                "rollout_of_dispatch_bound": common.limit_fraction(
                    kernels, stages["rollout"], 1.0 / limits["seconds_per_kernel"]),
                "rollout_s_per_decode_kernel": stages["rollout"] / kernels}
  return {"decode_read_bytes": decode, "step_model_flops": step, **dispatch,
          "rollout_of_bandwidth_bound": common.limit_fraction(
              decode, stages["rollout"], limits["read_bytes_per_s"]),
          "step_of_matmul_rate": common.limit_fraction(step, update,
                                                       limits["matmul_flops_per_s"])}


def summarize(iterations: list[dict[str, float]], trained_tokens: list[int]) -> dict[str, Any]:
  """Median iteration time, its stage shares (of the summed medians) and tokens/s."""
  stages = {k: float(np.median([it[k] for it in iterations])) for k in iterations[0]}
  total = float(np.median([sum(it.values()) for it in iterations]))
  tokens = float(np.median(trained_tokens))
  return {"iteration_s": total, "stage_s": stages,
          "stage_share": {k: v / sum(stages.values()) for k, v in stages.items()},
          "trained_tokens_per_iteration": tokens,
          "trained_tokens_per_s": tokens / total, "iterations_s": [sum(i.values())
                                                                   for i in iterations]}


def over_rounds(summaries: list[dict[str, Any]]) -> dict[str, Any]:
  """One side's figures over rounds: the median over rounds of each round's medians (as
  vs_tunix.py --rounds), so one disturbed round moves nothing; each round stays in `rounds`."""
  stages = {k: float(np.median([s["stage_s"][k] for s in summaries]))
            for k in summaries[0]["stage_s"]}
  total = float(np.median([s["iteration_s"] for s in summaries]))
  tokens = float(np.median([s["trained_tokens_per_iteration"] for s in summaries]))
  return {**summaries[-1], "iteration_s": total, "stage_s": stages,
          "stage_share": {k: v / sum(stages.values()) for k, v in stages.items()},
          "trained_tokens_per_iteration": tokens, "trained_tokens_per_s": tokens / total,
          "iterations_s": [t for s in summaries for t in s["iterations_s"]],
          "rounds": [{k: s[k] for k in ("iteration_s", "stage_s", "trained_tokens_per_s")}
                     for s in summaries]}


def plain_over_rounds(summaries: list[dict[str, Any]]) -> dict[str, Any]:
  """The plain JAX step over rounds: the median of each round's median time, each round's
  ratio of our step's median to it (the two ran side by side) and their median."""
  plain = [s["plain_jax_step"] for s in summaries]
  per_round = [p["ours_over_plain"] for p in plain]
  return {"step_s": float(np.median([p["step_s"] for p in plain])),
          "ours_over_plain": float(np.median(per_round)), "ours_over_plain_per_round": per_round,
          "steps_s": [t for p in plain for t in p["steps_s"]],
          "agreement": [a for p in plain for a in p["agreement"]]}


# ----------------------------------------------------------------------------- ours, common


def even_fraction(ids: Sequence[int]) -> float:
  """The tunix driver's dummy reward: the fraction of even token ids."""
  return float(np.mean([t % 2 == 0 for t in ids])) if len(ids) else 0.0


def run_ours_common(args: argparse.Namespace) -> dict[str, Any]:
  cfg = common.model_config(PRESET)
  config = vs_tunix.grpo_step_config(args.chunk)
  trainable, state = step_lib.create(from_config(cfg, 0), step_lib.make_optimizer(
      vs_tunix.OPTIMIZER), config, parallel.make_mesh())
  rows = args.prompts * args.group_size
  p, c = args.prompt_len, args.completion_len
  engine = JaxEngine(trainable.model(state), max_batch=rows, prompt_buckets=(p,),
                     max_new_tokens_buckets=(c,))
  params = SamplingParams(max_new_tokens=c, temperature=0.9)
  decode_hlo = common.record_decode_hlo(engine)   # to count a decode step's kernels
  # The naive version of the step, timed beside it on the same batch and parameters.
  policy = config.policy_gradient
  plain = PlainGRPOStep(trainable.model(state), learning_rate=vs_tunix.OPTIMIZER.learning_rate,
                        weight_decay=vs_tunix.OPTIMIZER.weight_decay,
                        eps_low=policy.eps_low, eps_high=policy.eps_high)
  rng = np.random.default_rng(0)
  carry = {"state": state}
  iterations, tokens, plain_s, agreement = [], [], [], []
  for index in range(args.warmup + args.iters):
    timer = StageTimer()
    prompts = rng.integers(3, cfg.vocab_size, (args.prompts, p))
    requests = [GenerationRequest(prompts[i // args.group_size].tolist(), params,
                                  seed=index * rows + i) for i in range(rows)]
    results = timer("rollout", lambda: engine.generate(requests, shared_prefill=True))
    rewards = timer("judge", lambda: np.array([even_fraction(r.output_ids) for r in results],
                                              np.float32).reshape(args.prompts, args.group_size))
    adv = timer("advantages", lambda: np.asarray(advantages_lib.grpo(rewards)).reshape(-1))
    batch = timer("batch", lambda: common_batch(prompts, results, adv, args.group_size,
                                                args.shared_prefix))

    def step():
      carry["state"], metrics = trainable.step(carry["state"], trainable.put_batch(batch))
      return metrics

    # The plain step's timer is its own: it is not part of our iteration. The two go first
    # in turn, so neither always runs on the cache the rollout left.
    plain_timer, weights = StageTimer(), plain.params(trainable.model(carry["state"]))
    plain_batch = {k: jax.numpy.asarray(v) for k, v in batch.items()
                   if k not in step_lib.SHARED_PREFIX_KEYS}
    run_plain = lambda: plain_timer("plain", lambda: plain(weights, plain_batch))  # noqa: E731
    if index % 2:
      _, plain_loss, plain_norm = run_plain()
    metrics = timer("step", step)
    if not index % 2:
      _, plain_loss, plain_norm = run_plain()
    if not np.isfinite(float(metrics["loss"])):
      raise RuntimeError(f"ours-common: non-finite loss at iteration {index}")
    agreement.append(plain_agreement(metrics, float(plain_loss), float(plain_norm), index))
    timer("sync", lambda: engine.update_weights(trainable.model(carry["state"]), index + 1))
    if index >= args.warmup:
      iterations.append(timer.seconds)
      tokens.append(int(batch["loss_mask"].sum()))
      plain_s.append(plain_timer.seconds["plain"])
  out = summarize(iterations, tokens)
  plain_median = float(np.median(plain_s))
  return {**out, "decode_kernels_per_step": common.while_body_kernels(decode_hlo()),
      "plain_jax_step": {"step_s": plain_median, "steps_s": plain_s,
                         "ours_over_plain": out["stage_s"]["step"] / plain_median,
                         "agreement": agreement}}


def plain_agreement(metrics: dict[str, Any], loss: float, grad_norm: float, index: int
                    ) -> dict[str, float]:
  """Our step's loss and gradient norm beside the plain step's on the same batch and
  parameters; raises where they differ beyond float32 rounding (then the two did not do the
  same work, and their times say nothing)."""
  ours_loss, ours_norm = float(metrics["loss"]), float(metrics["grad_norm"])
  if not (np.isclose(ours_loss, loss, rtol=1e-4, atol=1e-6)
          and np.isclose(ours_norm, grad_norm, rtol=1e-3, atol=1e-7)):
    raise RuntimeError(f"ours-common iteration {index}: the plain JAX step computed loss "
                       f"{loss} and gradient norm {grad_norm}, ours {ours_loss} and {ours_norm}")
  return {"loss": ours_loss, "plain_loss": loss, "grad_norm": ours_norm,
          "plain_grad_norm": grad_norm}


def common_batch(prompts: np.ndarray, results, adv: np.ndarray, group_size: int,
                 shared_prefix: bool = False) -> dict[str, np.ndarray]:
  """The Batch-contract rows of the single-turn work: prompt + completion, π_old = the
  sampler's log-probs, one advantage per row over its completion; with `shared_prefix` each
  group's prompt once (`batching.group_prefixes`: the step runs it once per group)."""
  rows, p = len(results), prompts.shape[1]
  c = max(len(r.output_ids) for r in results)
  ids = np.zeros((rows, p + c), np.int32)
  loss_mask = np.zeros((rows, p + c), np.float32)
  old = np.zeros((rows, p + c), np.float32)
  for i, result in enumerate(results):
    n = len(result.output_ids)
    ids[i, :p] = prompts[i // group_size]
    ids[i, p:p + n] = result.output_ids
    loss_mask[i, p:p + n] = 1.0
    old[i, p:p + n] = result.logprobs
  attention_mask = ((loss_mask > 0) | (np.arange(p + c) < p)).astype(np.int32)
  batch = {"input_ids": ids, "attention_mask": attention_mask,
           "loss_mask": loss_mask, "advantages": adv[:, None] * loss_mask,
           "old_logprobs": old}
  if shared_prefix:
    batch.update(batching.group_prefixes(ids, attention_mask, p, group_size))
  return batch


# ----------------------------------------------------------------------------- ours, agentic


def agentic_config(args: argparse.Namespace):
  """The main job's config with the tiny model's sizes: its envs, rollout and step settings."""
  config = common.load_config(str(MAIN_JOB_CONFIG))
  with config.unlocked():
    config.envs.names = list(args.envs)
    config.envs.difficulty = ml_collections.ConfigDict(
        {name: config.envs.difficulty[name].to_dict() for name in args.envs
         if name in config.envs.difficulty})
    config.select.pool_groups = args.pool_groups
    config.select.batch_groups = args.batch_groups
    config.rollout.group_size = args.group_size
    config.step.micro_batches = 1
    config.train.steps = args.warmup + args.iters
  return config


def run_ours_agentic(args: argparse.Namespace, tokenizer,
                     limits: dict[str, Any]) -> dict[str, Any]:
  config = agentic_config(args)
  pipelines.validate(config, num_devices=jax.device_count())
  hf = dict(common.MODEL_PRESETS[PRESET], vocab_size=tokenizer.vocab_size)
  model = from_config(ModelConfig.from_hf(hf, source=f"{PRESET} over the tokenizer's vocab"), 0)
  trainable, state = step_lib.create(model, step_lib.make_optimizer(
      config_lib.optimizer_config(config)), config_lib.step_config(config), parallel.make_mesh())
  settings = stages.stage_configs(config)
  engine = trainer._engine(settings, "", trainable.model(state), tokenizer)  # noqa: SLF001 - the job's
  pipeline = pipelines.make_pipeline(config, engine, tokenizer)
  throughput = flops.Throughput.for_devices(
      model.cfg, config.model.compute_dtype, ref_kl=trainable.config.needs_ref_params,
      num_iterations=trainable.config.num_iterations,
      old_policy_pass=trainable.config.fixed_per_batch)
  run = trainer.Run(config=config, settings=settings, tokenizer=tokenizer,
                    trainable=trainable, state=state, engine=engine, pipeline=pipeline,
                    checkpointer=None, log=None,
                    history=trainer.RunHistory(), throughput=throughput)
  iterations, tokens, step_work = [], [], []
  compiled: set = set()
  for step in range(args.warmup + args.iters):
    # The stages of trainer.train, in its order (no evaluation, logging or checkpoint).
    timer = StageTimer()
    record = timer("rollout", lambda: pipeline.roll_out(step))
    record = timer("judge", lambda: pipeline.judge(record))
    record = timer("advantages", lambda: pipeline.advantages(record))
    record = timer("select", lambda: pipeline.select(record))
    record = timer("teacher", lambda: pipeline.teach(record))
    batch = timer("batch", lambda: trainer.assemble(run, pipeline.rows(record)))
    metrics = timer("step", lambda: trainer.update(run, batch, compiled))
    if metrics["skipped_nonfinite"]:
      raise RuntimeError(f"ours-agentic: the step at iteration {step} was non-finite")
    compute_s = metrics["time/throughput/step_compute_s"]
    # The head runs over the columns the loss reads (learn/chunked.py): count those.
    used = np.asarray(batch["loss_mask"]) > 0
    if "distill_mask" in batch:
      used = used | (np.asarray(batch["distill_mask"]) > 0)
    rows, seq_len = np.shape(batch["input_ids"])
    head_tflops = flops.train_step_flops(
        model.cfg, rows, seq_len, flops.batch_forwards(batch, False,
                                                       trainable.config.micro_batches),
        head_positions=int(used[:, 1:].sum()), student_layout=flops.student_layout_of(batch),
        reference_forwards=float(trainable.config.needs_ref_params))["total"] / 1e12
    timer("sync", lambda: trainer.sync_weights(run, step + 1))
    pipeline.observe(record)
    if step >= args.warmup:
      iterations.append(timer.seconds)
      tokens.append(int(np.asarray(batch["loss_mask"]).sum()))
      step_work.append({"compute_s": compute_s, "tflops": head_tflops,
                        "padded_batch_tflops": metrics["throughput/model_tflops"],
                        "trained_tokens": metrics["throughput/trained_tokens"],
                        "shape": list(np.shape(batch["input_ids"]))})
  out = summarize(iterations, tokens)
  compute_s = float(np.median([w["compute_s"] for w in step_work]))
  tflops = float(np.median([w["tflops"] for w in step_work]))
  out.update(envs=list(args.envs), pool_groups=args.pool_groups,
             batch_groups=args.batch_groups, group_size=args.group_size,
             step_work=step_work, step_compute_s=compute_s,
             step_mfu=common.limit_fraction(tflops * 1e12, compute_s,
                                            limits["matmul_flops_per_s"]),
             step_trained_tokens_per_s=float(np.median(
                 [w["trained_tokens"] / w["compute_s"] for w in step_work])))
  return out


# ----------------------------------------------------------------------------- tunix


def run_tunix(args: argparse.Namespace) -> dict[str, Any]:
  python = vs_tunix.venv_python(args.venv)
  with tempfile.TemporaryDirectory() as tmp:
    out = Path(tmp) / "learner.json"
    command = [str(python), str(args.driver), "learner", *vs_tunix.CONFIGS[PRESET],
               "--prompts", str(args.prompts), "--G", str(args.group_size),
               "--P", str(args.prompt_len), "--C", str(args.completion_len),
               "--steps", str(args.warmup + args.iters), "--json", str(out)]
    done = subprocess.run(command, check=False, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if done.returncode:
      raise RuntimeError(f"the tunix driver failed ({' '.join(command)}):\n{done.stderr[-4000:]}")
    record = json.loads(out.read_text())[0]
  iterations = tunix_iterations(record, args.warmup)
  tokens = args.prompts * args.group_size * args.completion_len   # every completion token
  out = summarize(iterations, [tokens] * len(iterations))
  out.update(command=command, n_params=record["n_params"], total_s=record["total_s"])
  return out


def tunix_iterations(record: dict[str, Any], warmup: int) -> list[dict[str, float]]:
  """The driver's steady steps (after the warm-up) stage by stage: generate, update_actor and
  the rest of the loop's wall time per step (`mark_intervals_s`: from the learner taking one
  step's prompts to taking the next's), so that an iteration is the whole loop, as ours."""
  keep = lambda xs: xs[warmup:] or xs  # noqa: E731
  iterations = []
  for g, u, loop in zip(keep(record["generate_s"]), keep(record["update_actor_s"]),
                        keep(record["mark_intervals_s"])):
    # The driver rounds stage times to 1 ms and intervals to 0.1 ms.
    if loop < g + u - 2e-3:
      raise RuntimeError(f"the tunix driver's step took {loop} s from prompts to prompts, less "
                         f"than its generate ({g} s) and update ({u} s): its learner no longer "
                         "takes one step's prompts at a time")
    iterations.append({"rollout": g, "update": u, "other": max(loop - g - u, 0.0)})
  return iterations


# ----------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=str(common.RESULTS_DIR / "e2e.json"))
  parser.add_argument("--prompts", type=int, default=4, help="tasks per iteration (common)")
  parser.add_argument("--group-size", type=int, default=4, help="G")
  parser.add_argument("--prompt-len", type=int, default=64)
  parser.add_argument("--completion-len", type=int, default=64)
  parser.add_argument("--chunk", type=int, default=256, help="loss chunk of our step")
  parser.add_argument("--warmup", type=int, default=1)
  parser.add_argument("--iters", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=1,
                      help="alternating rounds of the tunix / ours-common pair")
  parser.add_argument("--envs", nargs="+", default=["frozenlake", "maze", "countdown",
                                                    "sokoban"])
  parser.add_argument("--pool-groups", type=int, default=4, help="K (agentic)")
  parser.add_argument("--batch-groups", type=int, default=1, help="B (agentic)")
  parser.add_argument("--tokenizer", default="smollm2-135m-instruct",
                      help="packaged model whose tokenizer the agentic part uses")
  parser.add_argument("--venv", type=Path, default=vs_tunix.DEFAULT_VENV)
  parser.add_argument("--driver", type=Path, default=vs_tunix.DEFAULT_DRIVER)
  parser.add_argument("--skip-tunix", action="store_true")
  parser.add_argument("--shared-prefix", action=argparse.BooleanOptionalAction, default=True,
                      help="our common step runs each group's prompt once (the default, as "
                           "the main job; --no-shared-prefix: row by row, as tunix)")
  args = parser.parse_args(argv)
  for key in ("prompts", "group_size", "prompt_len", "completion_len", "chunk", "iters",
              "rounds", "pool_groups", "batch_groups"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
  if args.warmup < 0:
    parser.error(f"--warmup must be >= 0, got {args.warmup}")
  if not args.skip_tunix:
    vs_tunix.check_driver(parser, args.driver)
  return args


def main(argv: Sequence[str] | None = None, tokenizer=None) -> dict[str, Any]:
  """Runs the three parts; `tokenizer` replaces the packaged one (tests)."""
  args = parse_args(argv)
  if tokenizer is None:
    _, tokenizer = from_pretrained(args.tokenizer, "float32")
  limits = common.probe_machine()
  parts: dict[str, Any] = {}
  sides = {"ours_common": run_ours_common}
  if not args.skip_tunix:
    vs_tunix.ensure_venv(args.venv)
    sides["tunix"] = run_tunix
  measured: dict[str, list] = {name: [] for name in sides}
  orders = []
  for index in range(args.rounds):
    # Alternate which side goes first, so a drift in the machine's load favours neither.
    order = sorted(sides, reverse=index % 2 == 0)
    orders.append(order)
    for name in order:
      print(f"round {index + 1}/{args.rounds}: {name} ...", flush=True)
      measured[name].append(sides[name](args))
  for name in ("tunix", "ours_common"):
    if name in measured:
      parts[name] = over_rounds(measured[name])
  parts["ours_common"]["plain_jax_step"] = plain_over_rounds(measured["ours_common"])
  print("ours, RISED on multi-turn environments ...", flush=True)
  parts["ours_agentic"] = run_ours_agentic(args, tokenizer, limits)
  for name in ("tunix", "ours_common"):
    if name in parts:
      parts[name]["limit_fractions"] = single_turn_limits(parts[name], args, limits)
  result: dict[str, Any] = {"machine": common.machine_record(limits), "args": {
      k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
      "model": PRESET, "round_orders": orders, **parts}
  if "tunix" in parts:
    result["ratio_ours_common_over_tunix"] = (parts["ours_common"]["trained_tokens_per_s"] /
                                              parts["tunix"]["trained_tokens_per_s"])
    # Each round's pair ran back to back, so its ratio shares the machine's state of the
    # moment; the VM's drift between rounds (±20 % here) cancels within a pair.
    result["ratio_per_round"] = [ours["trained_tokens_per_s"] / tunix["trained_tokens_per_s"]
                                 for ours, tunix in zip(measured["ours_common"],
                                                        measured["tunix"])]
    median = common.per_round_median(result["ratio_per_round"])
    if median:
      result["ratio_per_round_median"] = median
  print(f"\n{'part':14s} {'iter s':>8s} {'trained tok/s':>13s}  stage shares")
  for name, part in parts.items():
    shares = ", ".join(f"{k} {v:.0%}" for k, v in part["stage_share"].items())
    print(f"{name:14s} {part['iteration_s']:8.3f} {part['trained_tokens_per_s']:13.1f}  {shares}")
  for name in ("tunix", "ours_common"):
    if name in parts:
      fractions = parts[name]["limit_fractions"]
      print(f"{name}: rollout {fractions['rollout_of_bandwidth_bound']:.1%} of the bandwidth "
            f"bound, step {fractions['step_of_matmul_rate']:.1%} of the matmul rate")
      if "rollout_of_dispatch_bound" in fractions:
        print(f"{name}: decode launches {parts[name]['decode_kernels_per_step']} kernels per "
              f"step; the rollout takes {fractions['rollout_s_per_decode_kernel'] * 1e6:.1f} µs "
              f"per decode kernel, an empty kernel's launch "
              f"{limits['seconds_per_kernel'] * 1e6:.2f} µs (launch floor "
              f"{fractions['rollout_of_dispatch_bound']:.1%} of the rollout)")
  plain = parts["ours_common"]["plain_jax_step"]
  print(f"ours_common: step {parts['ours_common']['stage_s']['step'] * 1e3:.1f} ms, the plain JAX "
        f"step of the same loss {plain['step_s'] * 1e3:.1f} ms: ours / plain "
        f"{plain['ours_over_plain']:.2f} (median of rounds; same loss and gradient norm)")
  agentic = parts["ours_agentic"]
  print(f"ours_agentic step: MFU {agentic['step_mfu']:.1%}, "
        f"{agentic['step_trained_tokens_per_s']:.1f} trained tokens/s (compile excluded)")
  if "ratio_ours_common_over_tunix" in result:
    print(f"ours / tunix on the same work: {result['ratio_ours_common_over_tunix']:.2f}x")
  if "ratio_per_round_median" in result:
    print(f"ours / tunix {common.per_round_text(result['ratio_per_round_median'])}")
  print(f"machine: {limits['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s fp32 matmul, "
        f"{limits['read_bytes_per_s'] / 1e9:.2f} GB/s read; load average "
        f"{limits['load_average_before']} before, {result['machine']['load_average_after']} "
        "after")
  path = common.write_json(args.out, result)
  print(f"wrote {path}")
  return result


if __name__ == "__main__":
  main()
