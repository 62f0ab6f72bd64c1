"""Tiny-model GRPO benchmark for google-tunix 0.1.7 on CPU: the tunix side of
benchmarks/vs_tunix.py (`loss`) and benchmarks/e2e.py (`learner`).

Two parts:
  loss  : jit(value_and_grad(tunix grpo_loss_fn)) + optax AdamW update on a
          randomly initialised tiny Qwen3 (tunix.models.qwen3), B x (P + C)
          tokens, timed over N steps after warmup.
  learner: the full tunix GRPOLearner/RLCluster loop (vanilla rollout =
          tunix's own jitted KV-cache Sampler, dummy reward fn), timed per
          global step with rollout / actor-update split, and the loop's wall time
          per step (`mark_intervals_s`: between the learner taking one step's
          prompts from the dataset and taking the next's).

It runs in `.venv-tunix` (google-tunix==0.1.7 with our jax/jaxlib; benchmarks/vs_tunix.py
creates it at the repository root), never in rised_jax's environment: it imports only tunix
and its dependencies, so it must not import rised_jax or benchmarks/.

Usage (DRIVER = benchmarks/peers/tunix_grpo_bench.py):
  .venv-tunix/bin/python DRIVER loss    [--B 8 --P 64 --C 192 ...] [--json out.json]
  .venv-tunix/bin/python DRIVER learner [--prompts 4 --G 2 --C 64 ...]
  .venv-tunix/bin/python DRIVER all
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import tunix
from tunix.models.qwen3 import model as qwen3_lib
from tunix.models import dummy_model_creator
from tunix.rl import algo_core  # noqa: F401  (registers the "grpo" loss)
from tunix.rl import function_registry
from tunix.rl.grpo import grpo_learner as grpo_lib
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout


def tiny_qwen3_config(args):
  return qwen3_lib.ModelConfig(
      num_layers=args.layers,
      vocab_size=args.vocab,
      embed_dim=args.d,
      hidden_dim=args.mlp,
      num_heads=args.heads,
      head_dim=args.head_dim or args.d // args.heads,
      num_kv_heads=args.kv_heads,
      rope_theta=10_000,
      norm_eps=1e-6,
      use_tied_embedding=True,
  )


def make_mesh():
  # tunix's default ShardingConfig uses logical axes ("fsdp", "tp").
  return jax.make_mesh((1, 1), ("fsdp", "tp"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def build_model(cfg, mesh, seed=0):
  # Same path tunix uses for "random weights" (no download): nnx.eval_shape of
  # the model class, then random normal params (scale 0.02) per leaf.
  return dummy_model_creator.create_dummy_model(
      qwen3_lib.Qwen3, cfg, mesh=mesh, dtype=jnp.float32, random_seed=seed)


def n_params(model):
  st = nnx.state(model, nnx.Param)
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(st))


class WordTokenizer:
  """Minimal tokenizer accepted by tunix.generate.TokenizerAdapter (type NONE):
  token i <-> word 'w{i}'; 0=pad, 1=bos, 2=eos."""

  def __init__(self, vocab):
    self.vocab = vocab

  def encode(self, text, **kw):
    if isinstance(text, np.ndarray):  # tunix passes 0-d np.str_ arrays
      text = text.item() if text.ndim == 0 else " ".join(map(str, text.tolist()))
    out = []
    for w in str(text).split():
      if w.startswith("w") and w[1:].isdigit() and int(w[1:]) < self.vocab:
        out.append(int(w[1:]))
    return out

  def decode(self, ids, **kw):
    return " ".join(f"w{int(i)}" for i in ids)

  def bos_id(self):
    return 1

  def eos_id(self):
    return 2

  def pad_id(self):
    return 0


# --------------------------------------------------------------------------
# Part 1: policy loss fwd+bwd (+AdamW update), jitted.
# --------------------------------------------------------------------------
def bench_loss(args):
  cfg = tiny_qwen3_config(args)
  mesh = make_mesh()
  with mesh:
    model = build_model(cfg, mesh)
  print(f"[loss] params={n_params(model):,} cfg={cfg}", flush=True)

  algo = grpo_lib.GRPOConfig(num_generations=args.G, num_iterations=1,
                             beta=0.0, epsilon=0.2, loss_algo="grpo")
  algo.temperature = 1.0  # GRPOLearner normally copies it from rollout cfg
  policy_loss_fn = function_registry.get_policy_loss_fn("grpo")
  pad_id, eos_id = 0, 2

  B, P, C = args.B, args.P, args.C
  rng = np.random.default_rng(0)
  prompt = rng.integers(3, cfg.vocab_size, (B, P)).astype(np.int32)
  # left-pad a few prompt tokens, right-pad a few completion tokens (realistic)
  prompt[:, : P // 8] = pad_id
  comp = rng.integers(3, cfg.vocab_size, (B, C)).astype(np.int32)
  lens = rng.integers(C // 2, C + 1, (B,))
  for i, l in enumerate(lens):
    comp[i, l:] = pad_id
  ex = grpo_lib.TrainExample(
      prompt_ids=jnp.asarray(prompt),
      prompt_mask=jnp.asarray(prompt != pad_id),
      completion_ids=jnp.asarray(comp),
      completion_mask=jnp.asarray(comp != pad_id),
      ref_per_token_logps=None,
      advantages=jnp.asarray(rng.standard_normal(B).astype(np.float32)),
      old_per_token_logps=jnp.asarray(
          -np.abs(rng.standard_normal((B, C))).astype(np.float32) - 5.0),
  )

  def loss_fn(m, e):
    return policy_loss_fn(m, e, algo_config=algo, pad_id=pad_id,
                          eos_id=eos_id)

  optimizer = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)

  @nnx.jit
  def train_step(m, opt, e):
    (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(m, e)
    opt.update(m, grads)
    return loss, aux

  @nnx.jit
  def fwd_bwd(m, e):
    (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(m, e)
    return loss, grads

  res = {}
  for name, fn, fargs in [("fwd_bwd", fwd_bwd, (model, ex)),
                          ("train_step", train_step, (model, optimizer, ex))]:
    t0 = time.perf_counter()
    out = fn(*fargs)
    jax.block_until_ready(out)
    compile_s = time.perf_counter() - t0
    for _ in range(args.warmup):
      jax.block_until_ready(fn(*fargs))
    ts = []
    for _ in range(args.iters):
      t0 = time.perf_counter()
      out = fn(*fargs)
      jax.block_until_ready(out)
      ts.append(time.perf_counter() - t0)
    med = float(np.median(ts))
    res[name] = dict(first_call_s=round(compile_s, 3),
                     median_s=round(med, 5), min_s=round(min(ts), 5),
                     tok_per_s_total=round(B * (P + C) / med, 1),
                     tok_per_s_completion=round(B * C / med, 1))
    print(f"[loss] {name}: first(compile)={compile_s:.2f}s median={med*1e3:.1f}ms"
          f" min={min(ts)*1e3:.1f}ms  {B*(P+C)/med:,.0f} tok/s (B={B},T={P+C})",
          flush=True)
  loss, aux = train_step(model, optimizer, ex)
  print(f"[loss] loss={float(loss):.5f} pg_clipfrac={float(aux['pg_clipfrac']):.4f}")
  return dict(part="loss", B=B, P=P, C=C, n_params=n_params(model), **res)


# --------------------------------------------------------------------------
# Part 2: full GRPOLearner with vanilla (tunix Sampler) rollout.
# --------------------------------------------------------------------------
def bench_learner(args):
  cfg = tiny_qwen3_config(args)
  mesh = make_mesh()
  with mesh:
    actor = build_model(cfg, mesh, seed=0)
    reference = build_model(cfg, mesh, seed=0) if args.beta > 0 else None
  tok = WordTokenizer(cfg.vocab_size)
  print(f"[learner] params={n_params(actor):,}", flush=True)

  rollout_cfg = base_rollout.RolloutConfig(
      max_tokens_to_generate=args.C,
      max_prompt_length=args.P,
      kv_cache_size=args.P + args.C + 8,
      temperature=0.9, top_p=1.0, top_k=None,
      eos_tokens=[-1],  # never stop early -> fixed-length completions
  )
  training_cfg = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optax.adamw(1e-4),
      eval_every_n_steps=10_000,
      max_steps=args.steps,
      metrics_logging_options=None,
      pbar_description=None,
  )
  cluster_cfg = rl_cluster_lib.ClusterConfig(
      role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh,
                    rl_cluster_lib.Role.REFERENCE: mesh,
                    rl_cluster_lib.Role.ROLLOUT: mesh},
      rollout_engine="vanilla",
      offload_to_cpu=False,
      training_config=training_cfg,
      rollout_config=rollout_cfg,
  )
  cluster = rl_cluster_lib.RLCluster(actor=actor, reference=reference,
                                     tokenizer=tok, cluster_config=cluster_cfg)
  algo = grpo_lib.GRPOConfig(num_generations=args.G, num_iterations=1,
                             beta=args.beta, epsilon=0.2)

  def reward_fn(prompts, completions, **kw):
    # dummy reward: fraction of even token ids in the completion
    out = []
    for c in completions:
      ids = tok.encode(c)
      out.append(float(np.mean([i % 2 == 0 for i in ids])) if ids else 0.0)
    return out

  learner = grpo_lib.GRPOLearner(rl_cluster=cluster, algo_config=algo,
                                 reward_fns=reward_fn)

  # Instrument phases.
  timings = {"generate": [], "update_actor": [], "ref_logps": []}

  def wrap(obj, name, key):
    orig = getattr(obj, name)

    def f(*a, **k):
      t0 = time.perf_counter()
      out = orig(*a, **k)
      jax.block_until_ready(jax.tree.leaves(out) if out is not None else [])
      timings[key].append(time.perf_counter() - t0)
      return out
    setattr(obj, name, f)

  wrap(cluster, "generate", "generate")
  wrap(cluster, "update_actor", "update_actor")
  wrap(cluster, "get_ref_per_token_logps", "ref_logps")

  rng = np.random.default_rng(0)
  step_marks = []

  def dataset():
    for _ in range(args.steps + 1):
      step_marks.append(time.perf_counter())
      prompts = []
      for _ in range(args.prompts):
        ids = rng.integers(3, cfg.vocab_size, args.P - 1)
        prompts.append(" ".join(f"w{i}" for i in ids))
      # Must be an np.ndarray: tunix does jax.tree.map(np.repeat(x, G)) over the
      # batch, and a python list would be treated as a pytree of string leaves.
      yield {"prompts": np.array(prompts)}

  t0 = time.perf_counter()
  learner.train(dataset())
  total = time.perf_counter() - t0
  step_marks.append(time.perf_counter())

  n_seq = args.prompts * args.G
  gen = timings["generate"]
  upd = timings["update_actor"]
  steady_gen = gen[1:] if len(gen) > 1 else gen
  steady_upd = upd[1:] if len(upd) > 1 else upd
  steady_step = [g + u for g, u in zip(steady_gen, steady_upd)]
  res = dict(
      part="learner", prompts=args.prompts, G=args.G, P=args.P, C=args.C,
      steps=args.steps, beta=args.beta, n_params=n_params(actor),
      total_s=round(total, 2),
      generate_s=[round(x, 3) for x in gen],
      update_actor_s=[round(x, 3) for x in upd],
      ref_logps_s=[round(x, 3) for x in timings["ref_logps"]],
      mark_intervals_s=[round(b - a, 4) for a, b in zip(step_marks, step_marks[1:])],
      train_steps=cluster.actor_trainer.train_steps,
  )
  if steady_step:
    med_gen = float(np.median(steady_gen))
    med_upd = float(np.median(steady_upd))
    res.update(
        steady_generate_median_s=round(med_gen, 4),
        steady_update_median_s=round(med_upd, 4),
        rollout_completion_tok_per_s=round(n_seq * args.C / med_gen, 1),
        train_tok_per_s=round(n_seq * (args.P + args.C) / med_upd, 1),
        step_tok_per_s=round(n_seq * (args.P + args.C) / (med_gen + med_upd), 1),
    )
  print("[learner] " + json.dumps(res), flush=True)
  return res


def main():
  p = argparse.ArgumentParser()
  p.add_argument("part", choices=["loss", "learner", "all"])
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--d", type=int, default=128)
  p.add_argument("--mlp", type=int, default=512)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--kv_heads", type=int, default=2)
  p.add_argument("--head_dim", type=int, default=0, help="0 -> d // heads")
  p.add_argument("--vocab", type=int, default=512)
  p.add_argument("--B", type=int, default=8)
  p.add_argument("--P", type=int, default=64)
  p.add_argument("--C", type=int, default=192)
  p.add_argument("--G", type=int, default=4)
  p.add_argument("--prompts", type=int, default=2)
  p.add_argument("--steps", type=int, default=4)
  p.add_argument("--beta", type=float, default=0.0)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--iters", type=int, default=10)
  p.add_argument("--json", type=str, default=None)
  args = p.parse_args()
  print(f"jax={jax.__version__} devices={jax.devices()} tunix={getattr(tunix, '__version__', '?')}",
        flush=True)
  results = []
  if args.part in ("loss", "all"):
    results.append(bench_loss(args))
  if args.part in ("learner", "all"):
    results.append(bench_learner(args))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
