"""rised_jax: RISED and CriPO, rubric-guided RL for LLM agents, in JAX.

Start with the README and docs/; the data that flows between stages is in `rised_jax.types`.
"""
__version__ = "0.1.0"
