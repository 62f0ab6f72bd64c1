"""CriPO at paper scale on Qwen3-4B: the settings of cripo_qwen3_1p7b.py with β = 0.03.

  python -m sglang.launch_server --model-path /models/Qwen3-4B --port 30000
  python -m sglang.launch_server --model-path /models/Qwen3-32B --port 30001 --tp 4
  rised-train --config experiments/configs/cripo_qwen3_4b.py:cripo --workdir /runs/cripo_4b \
      --config.model.source=/models/Qwen3-4B

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
