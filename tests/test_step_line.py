"""The per-step line the trainer prints: stage seconds and tokens per second, by hand."""
from rised_jax.trainer import step_line


def test_rates_of_rollout_and_update_and_the_other_stages():
  metrics = {"time/rollout": 16.0, "rollout/agent_tokens": 1200.0, "time/step": 8.0,
             "loss_tokens": 2000.0, "time/judge": 0.25, "time/sync": 0.5, "time/eval": 31.0,
             "loss": 0.1, "time/throughput/mfu": 0.3, "time/compile/cache_hits": 2.0}
  assert step_line(3, 6, metrics) == (
      "step 3/6 | rollout 16.0 s (1,200 tokens generated, 75.0 tokens/s) | "
      "step 8.0 s (2,000 tokens trained, 250.0 tokens/s) | eval 31.0 s | other stages 0.8 s")


def test_a_pipeline_without_token_counts_gets_seconds_only():
  metrics = {"time/rollout": 2.0, "time/step": 0.0, "loss_tokens": 5.0}
  assert step_line(1, 2, metrics) == ("step 1/2 | rollout 2.0 s | step 0.0 s | "
                                      "other stages 0.0 s")
