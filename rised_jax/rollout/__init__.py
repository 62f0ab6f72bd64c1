"""Rollouts: the `Engine` protocol (base.py), the in-process KV-cache sampler (jax_engine.py), the
SGLang client (sglang_engine.py) and the multi-turn agent loop (agent_loop.py)."""
