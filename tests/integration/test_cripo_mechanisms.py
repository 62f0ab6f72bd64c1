"""CriPO's branches act on the mechanism suite (experiments/configs/mechanisms_cripo.py).

A short warm-start (rised_jax.warmstart_cripo), then a short `cripo` run on the word_choice
tasks: tokens flip (the counterfactual teacher), tokens are kept for the distillation (the
injection teacher) and the KL to the injection teacher falls over the run
(`warmstart_cripo.branch_activity` on the run's metrics.jsonl). With the branches switched off
(grpo_rubric) the same check fails: no step logs a kept or a flipped token
(`test_branch_activity_hand_worked`; docs/cripo.md "Mechanism suite" counts the seed streams
that pass).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from rised_jax import runlog, trainer, warmstart_cripo
from rised_jax.model import save_pretrained
from tests.helpers.run_fixtures import load_config_file

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "mechanisms_cripo.py"
WARMSTART_STEPS = 300
RL_STEPS = 10


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0])   # one seed: ~2-3 CPU-minutes each; 5 of 5 streams pass
def test_cripo_branches_act_on_the_mechanism_suite(tmp_path, seed):
  model, tokenizer, _ = warmstart_cripo.train(WARMSTART_STEPS, seed, 32, 3e-3, log_every=0)
  config = load_config_file(CONFIG, "cripo")
  config.model.source = str(save_pretrained(model, tokenizer, tmp_path / "model"))
  config.seed = seed
  config.train.steps = RL_STEPS
  config.train.eval_every = 0
  config.train.checkpoint_every = RL_STEPS
  trainer.train(config, tmp_path / "run")
  activity = warmstart_cripo.branch_activity(
      runlog.read_jsonl(tmp_path / "run" / runlog.METRICS_FILE))
  assert activity["steps"] == RL_STEPS
  assert activity["holds"], activity
