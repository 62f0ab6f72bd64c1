"""What every key of `config.default_config()` means: the one place a key is described.

`DESCRIPTIONS` maps a dotted key to its meaning, or to `(type, meaning)` where the default does
not show the type (a `None` default). A key naming a dict whose entries are free-form
(`judge.options`, `envs.difficulty`, …) is described as a whole and its entries are not listed.
`rised_jax.config_reference` renders the table of docs/config.md from this and the defaults;
tests/test_config_reference.py fails when a key of `default_config()` has no entry here, or an
entry names no key. A new key gets its line here in the same change.
"""
from __future__ import annotations

DESCRIPTIONS: dict[str, str | tuple[str, str]] = {
    # top level
    "algorithm": "preset applied by the config file (`FILE.py:NAME`) or re-applied by "
                 "`--config.algorithm`: rised, grpo, dapo, variance, env_curriculum, the ablations "
                 "and controls, cripo, cripo_u, cripo_s, grpo_rubric (see the presets table)",
    "pipeline": "stage family: `agentic` (RISED and its baselines on multi-turn environments) or "
                "`rubric` (CriPO and rubric GRPO on rubric tasks)",
    "seed": "seed of the task stream, the sampler and the selector",
    "advantage": "group advantage estimator: grpo, drgrpo or rloo (`learn/advantages.py`)",

    # model
    "model.source": "an HF directory, a `.gguf` file, or a packaged model name",
    "model.param_dtype": "dtype of the master weights and Adam state (float32: a small update "
                         "rounds away in bfloat16)",
    "model.compute_dtype": "dtype of activations and matmuls, and of the sampler's and the "
                           "exported weights (bfloat16 on accelerators)",
    "model.remat": "rematerialise each layer in the backward pass (less memory, more compute)",
    "model.scan_layers": "stack the layers and run them under one `lax.scan`: compile time "
                         "flat in depth",

    # envs
    "envs.names": "environments trained and evaluated on: built-in names, aliases, entry "
                  "points or `module:Class` import paths",
    "envs.difficulty": "per environment name, its constructor's keyword arguments "
                       "(`{'maze': {'width': 3}}`)",
    "envs.max_turns": "turn budget of an episode; 0 keeps each environment's own",
    "envs.max_abs_reward": "largest |reward| an environment step may return; a larger one (or a "
                           "non-finite one) is an environment error and drops its group",
    "envs.aliases": "short name -> `package.module:Class`, to register a plug-in (one class may "
                    "appear under several names with their own difficulty)",

    # rollout
    "rollout.engine": "rollout engine: `jax` (the in-process KV-cache sampler) or `sglang` "
                      "(an SGLang server over HTTP)",
    "rollout.sglang_url": "base URL of the SGLang server",
    "rollout.sglang.timeout_s": "deadline of one HTTP request to the server as a whole "
                                "(connect, headers and body), seconds",
    "rollout.sglang.max_reply_bytes": "largest SGLang reply read, bytes; a larger one fails its "
                                      "request (not retried)",
    "rollout.sglang.retries": "retries of a failed or invalid server request before its group "
                              "is dropped",
    "rollout.sglang.weight_dir": "directory the SGLang host reads where weight sync exports "
                                 "each version (\"\" = `<workdir>/weights`; needed when the "
                                 "workdir is a bucket URL)",
    "rollout.sglang.weight_sync": "how each step's weights reach the SGLang server: `disk` "
                                  "(an export into weight_dir, loaded by "
                                  "/update_weights_from_disk; any server that reads that "
                                  "directory) or `tensor` (the tensors in "
                                  "/update_weights_from_tensor request bodies, nothing "
                                  "written; a server on the same node; a server without that "
                                  "endpoint falls back to `disk` with a warning)",
    "rollout.sglang.tensor_bucket_bytes": "most raw tensor bytes in one "
                                          "/update_weights_from_tensor body (weight_sync="
                                          "`tensor`); the model goes in several requests",
    "rollout.group_size": "G, rollouts per task (one group)",
    "rollout.temperature": "sampling temperature of training rollouts",
    "rollout.top_p": "nucleus sampling threshold (1.0: off)",
    "rollout.top_k": "top-k sampling (0: off)",
    "rollout.max_new_tokens_per_turn": "reply length cap of one turn, tokens",
    "rollout.max_total_tokens": "cap of an episode's whole transcript, tokens",
    "rollout.max_batch": "most rows the sampler decodes at once",
    "rollout.reply_prefix": "text forced at the start of every reply (context, not trained "
                            "on), e.g. `<answer>` for a model too small to keep the format",
    "rollout.stop_strings": "texts that end a reply (e.g. `['</answer>']`)",
    "rollout.batch_buckets": "sampler batch-size buckets, each compiled once ([] = powers of two "
                             "up to `max_batch`)",
    "rollout.reuse_prefix": "keep each call's KV caches so the next turn prefills only what the "
                            "environment added (one more set of caches in memory)",
    "rollout.decode_chunk": "decode steps per sampler call (0: one call per turn); between calls "
                            "finished replies end and rows leave the batch when the rest fit a "
                            "smaller bucket",
    "rollout.matmul_operands": "the in-process sampler's dense-layer and head operands: "
                               "'compute' (the compute dtype) or 'bfloat16' (float32 "
                               "operands rounded to bfloat16, products summed in float32)",
    "rollout.async_rollouts": "roll out step t + 1 in a background thread while step t trains "
                              "(one step stale, corrected by the truncated importance weight)",
    "rollout.prompt_buckets": "sampler prompt-length buckets, tokens",
    "rollout.new_token_buckets": "sampler new-token buckets, tokens",

    # judge
    "judge.backend": "tag judge of the agentic pipeline: rules, genai, openai, inprocess, or a "
                     "plug-in",
    "judge.vocabulary": "rubric vocabulary: a JSON file, an entry point or import path (\"\" = "
                        "the built-in agentic_v1)",
    "judge.options": "backend options (model, base_url, timeout_s, max_retries, …)",
    "judge.max_new_tokens": "answer length of the in-process judge, tokens",

    # select
    "select.name": "selector: rised, random, uniform, dapo, variance, env_curriculum, "
                   "success_rate, or a plug-in",
    "select.pool_groups": "K, candidate groups rolled out per step",
    "select.batch_groups": "B, groups trained on per step",
    "select.compute_matched": "uniform selector: roll out K groups and train on all K "
                              "(the grpo_matched control)",
    "select.options": "selector options (λ, objective, similarity, history penalty, …)",

    # teacher and guidance
    "teacher.enabled": "positive-rubric self-distillation teacher on (needs `step.beta` > 0)",
    "teacher.options": "`teach.PositiveTeacher` options (sources, max_tags, context, template)",
    "guidance.enabled": "negative-rubric guidance hints in later rollouts",
    "guidance.train_with_hint": "train on the prompt with the hint (False: on the hint-free "
                                "prompt with the truncated importance weight, §2.6)",
    "guidance.options": "guidance memory: EMA `rate`, tag `threshold`, `top_m` tags per hint",

    # step (learn.train_step.StepConfig)
    "step.aggregation": "token aggregation of the loss: seq-mean-token-mean, token-mean or "
                        "seq-mean-token-sum-norm",
    "step.eps_low": "PPO clip range below 1",
    "step.eps_high": "PPO clip range above 1 (DAPO: 0.28)",
    "step.dual_clip": ("float | None", "dual-clip constant for negative advantages (None: off)"),
    "step.importance_cap": ("float | None", "cap C of the truncated behaviour importance weight "
                                            "min(π/π_behaviour, C) (None: no weight)"),
    "step.behaviour_weight": "apply the behaviour importance weight (False: w_t = 1, the "
                             "rised_hint_no_iw control)",
    "step.seq_len_norm": "L_norm of the seq-mean-token-sum-norm aggregation",
    "step.ref_kl_coef": "weight of the KL to the initial policy (0: off)",
    "step.ref_kl_estimator": "estimator of the reference KL: k1, k2 or k3",
    "step.beta": "weight β of the distillation term (0 switches the teacher off)",
    "step.beta_warmup_steps": "steps over which β ramps up from 0",
    "step.teacher": "teacher parameters: live (the student's, stop-gradient), ema or frozen",
    "step.ema_rate": "update rate of an EMA teacher",
    "step.divergence": "distillation divergence: forward-kl, reverse-kl, jsd or sampled-token",
    "step.topk": ("int | None", "top-k support of the divergence plus a tail bucket (None: the "
                                "full vocabulary)"),
    "step.clamp": ("float | None", "clamp of the per-token divergence (CriPO: 10; None: off)"),
    "step.clamp_loss": "the loss uses min(d, clamp), so tokens above it get no gradient (False: "
                       "the clamp only ranks tokens for localisation)",
    "step.localize": "CriPO localised distillation: keep the highest-divergence tokens only",
    "step.localize_gamma": "share γ of the divergence mass the kept tokens cover",
    "step.localize_edge_frac": "fraction of a response's highest-divergence tokens skipped as "
                               "edges",
    "step.distill_norm": "normaliser of L_distill: distill-tokens or kept-tokens (the CriPO "
                         "paper's)",
    "step.counterfactual": "CriPO counterfactual advantage flips",
    "step.flip_alpha": "α of the flip rule",
    "step.flip_tau": "τ_flip of the flip rule",
    "step.chunk": "sequence chunk of the fused logits scan, tokens",
    "step.micro_batches": "gradient-accumulation micro-batches per step",
    "step.max_update_ratio": "update-size guard: a step whose update has ‖Δθ‖ > this × ‖θ‖ is "
                             "skipped and counted (train/skipped_large_update)",

    # optim (learn.train_step.OptimizerConfig)
    "optim.learning_rate": "AdamW peak learning rate",
    "optim.warmup_steps": "linear warm-up steps",
    "optim.schedule": "learning-rate schedule after warm-up: constant, cosine or linear",
    "optim.total_steps": "length of the decay schedule, steps",
    "optim.end_learning_rate": "learning rate the decay ends at",
    "optim.b1": "AdamW β1",
    "optim.b2": "AdamW β2",
    "optim.eps": "AdamW ε",
    "optim.weight_decay": "AdamW decoupled weight decay",
    "optim.max_grad_norm": ("float | None", "global gradient-norm clip (None: off)"),

    # batching
    "batching.prefix_multiple": "teacher/student prefix columns are padded to a multiple of "
                                "this (fewer step shapes to compile)",
    "batching.response_multiple": "response columns are padded to a multiple of this",
    "batching.length_buckets": "total row widths (prefix + response columns): a batch is "
                               "widened to the smallest that holds it, by left-padding the "
                               "prefixes, so the step compiles once per bucket ([]: off)",
    "batching.shared_prefix": ("a group's rows share their prefix: the step's student forward "
                               "runs it once per group instead of once per row "
                               "(model/shared_prefix.py); a batch with a group whose prefixes "
                               "differ runs row by row. The step compiles per prefix width too, "
                               "so length_buckets then widen the responses, not the prefixes"),

    # mesh
    "mesh.data": "data-parallel axis size",
    "mesh.fsdp": "FSDP axis size (-1: every device left)",
    "mesh.tensor": "tensor-parallel axis size",

    # train
    "train.steps": "training steps",
    "train.num_iterations": ("PPO passes over each rollout batch (GRPO's μ), all against log π_old "
                             "fixed before the first update; 1: the on-policy step (ratio 1)"),
    "train.mini_batches": ("successive updates per pass, each on a strided 1/M of the rows "
                           "(its own mean); μ · M optimizer updates per step"),
    "train.eval_every": "held-out evaluation every N steps (0: only before and after training)",
    "train.checkpoint_every": "checkpoint every N steps",
    "train.keep_checkpoints": "checkpoints kept on disk",
    "train.log_every": "log scalars every N steps",
    "train.max_nonfinite_steps": "consecutive skipped (non-finite loss or gradient) steps that "
                                 "stop the run",
    "train.wandb": "also log every scalar to Weights & Biases (offline unless WANDB_MODE)",
    "train.peak_flops_per_s": "the MFU's denominator, FLOP/s of all devices together (0: the "
                              "published bf16 peak of a listed device kind, else the measured "
                              "matmul rate; learn/flops.py)",
    "train.compilation_cache": "JAX's persistent compilation cache: 'auto' ($JAX_COMPILATION_"
                               "CACHE_DIR, else $RISED_JAX_CACHE/jax, default "
                               "~/.cache/rised_jax/jax), a directory, or '' for none",
    "train.profile_steps": "[first, last): steps traced by jax.profiler into <workdir>/profile "
                           "([] for none)",

    # eval
    "eval.episodes_per_env": "distinct held-out instances evaluated per environment",
    "eval.seed_offset": "first held-out seed; training never plays these instances",
    "eval.temperature": "evaluation sampling temperature (0: greedy)",
    "eval.pass_at_k": "k > 1: pass@k of k sampled episodes per instance (needs temperature > 0)",

    # rubric (CriPO)
    "rubric.tasks": "JSONL rubric task file (\"\" = the built-in offline science and medicine "
                    "set)",
    "rubric.eval_tasks": "held-out tasks (a seeded subset), never trained on",
    "rubric.split_seed": "seed of the held-out subset (independent of `seed`)",
    "rubric.eval_groups": "evaluation group -> the task domains it reports on",
    "rubric.system_prompt": "system prompt of the answering policy",
    "rubric.max_new_tokens": "answer length, tokens",
    "rubric.strip_thinking": "judge and teachers see the answer after `</think>`",
    "rubric.uc_branch": "CriPO criterion-injection teacher for unexplored criteria (needs "
                        "`step.beta`)",
    "rubric.sc_branch": "CriPO counterfactual teacher for suppressed criteria "
                        "(`step.counterfactual`)",
    "rubric.injection_template": "Jinja template of the injection teacher's prompt (\"\" = "
                                 "`teach/cripo_templates/injection.jinja`)",
    "rubric.counterfactual_template": "Jinja template of the counterfactual teacher's prompt "
                                      "(\"\" = `teach/cripo_templates/counterfactual.jinja`)",
    "rubric.cripo.reward_normalizer": "normaliser of the weighted reward: sum (Σω, the paper's), "
                                      "abs (Σ|ω|) or positive (Σ of positive ω)",
    "rubric.cripo.adv_eps": "ε added to the advantage's standard deviation",
    "rubric.cripo.max_uc": "most unexplored criteria injected per group",
    "rubric.cripo.uc_include_pitfalls": "count unmet pitfalls as unexplored criteria",
    "rubric.judge.backend": "criteria judge: checker (deterministic, offline), genai, openai or "
                            "inprocess",
    "rubric.judge.options": "criteria-judge backend options",
    "rubric.judge.max_new_tokens": "answer length of the in-process criteria judge, tokens",
}
