"""Experiment configs, one file per experiment: `get_config(arg)` for `--config FILE[:ARG]`.

Each file imports only rised_jax (config, config_args, recipes), so it loads by path from any
working directory and as a module of this package (`experiments.configs.tiny_cpu`); what
several files share lives in rised_jax.recipes, never in a sibling file.
"""
