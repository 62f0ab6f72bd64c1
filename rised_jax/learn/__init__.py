"""The learning core: advantages, losses and the fused train step.

Every choice that a config names by string (advantage estimator, loss aggregation, KL estimator,
distillation divergence) is a `rised_jax.plugins.Registry` in its module (`ADVANTAGES`,
`AGGREGATIONS`, `KL_ESTIMATORS`, `DIVERGENCES`): `bind(name, **options)` turns a config string
plus options into a callable and rejects unknown names or options with a clear error before
anything is traced or compiled.
"""
