"""CriPO at paper scale on Qwen3-4B: the settings of cripo_qwen3_1p7b.py with β = 0.03.

  experiments/launch/gpu_node_sglang.sh --model /models/Qwen3-4B \
      --config experiments/configs/cripo_qwen3_4b.py:cripo --workdir /runs/cripo_4b \
      --server-gpus 0,1,2,3 --server-args "--dp 4" --train-gpus 4,5,6,7 \
      -- --config.rubric.judge.options.base_url=http://JUDGE_HOST:30001/v1

Argument: "PRESET[,local]" as in cripo_qwen3_1p7b.py (whose docstring has the details).
Hardware: one node of 8 80-GB GPUs for the trainer plus the two servers' GPUs; time not measured.
"""
import importlib.util
import os


def _paper_config():
  """`paper_config` of the sibling file (config files are loaded by path, not as a package)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cripo_qwen3_1p7b.py")
  spec = importlib.util.spec_from_file_location("cripo_qwen3_1p7b", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.paper_config


def get_config(arg: str | None = None):
  return _paper_config()(arg, model="Qwen3-4B", beta=0.03)
