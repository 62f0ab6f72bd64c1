"""Device mesh, logical-axis → mesh-axis rules, shardings, and multi-host start-up.

The mesh has three axes, always in this order:

  data    pure data parallelism: parameters replicated, batch split.
  fsdp    fully-sharded data parallelism: the batch is split AND parameters / optimizer state
          are sharded along their `embed` dimension (gathered per layer by XLA).
  tensor  tensor (model) parallelism: heads, MLP width and vocabulary are split.

Parameters carry logical axis names in their metadata (`out_sharding`, set by the decoder);
`LOGICAL_RULES` maps them to mesh axes. A dimension whose size the mesh axis does not divide
stays replicated (tiny test configs on many devices), and a mesh axis is used at most once per
array, so any config runs on any mesh.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import pickle
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from rised_jax.checks import is_int

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis name -> mesh axis, a tuple of mesh axes (split over their product), or None
# (replicated). The activation_* names are the decoder's residual stream [B, T, D], laid out
# as the batch is fed (`batch_sharding`).
LOGICAL_RULES: Mapping[str, str | tuple[str, ...] | None] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    "norm": None,
    "layers": None,
    "activation_batch": BATCH_AXES,
    "activation_length": None,
    "activation_embed": None,
}


@dataclasses.dataclass(frozen=True)
class MeshShape:
  """Sizes of the ('data', 'fsdp', 'tensor') axes; one of them may be -1 (all the rest)."""

  data: int = 1
  fsdp: int = -1
  tensor: int = 1

  @classmethod
  def from_config(cls, section: Any) -> MeshShape:
    """config.mesh (docs/config.md); a key other than the three axes is refused by name."""
    sizes = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    if set(sizes) != set(MESH_AXES):
      raise ValueError(f"config.mesh={sizes}: expected the keys {MESH_AXES}")
    return cls(**sizes)

  def check(self, num_devices: int | None = None) -> None:
    """The shape itself (integer sizes, positive or one -1), and with `num_devices` (known
    once JAX has started) that it fits them; without it a dry run on another machine checks
    only the shape."""
    sizes = dataclasses.asdict(self)
    if not all(is_int(v) for v in sizes.values()):
      raise ValueError(f"config.mesh={sizes}: expected integer sizes (or -1 for all the rest)")
    # Without the devices, resolve against the product of the fixed sizes.
    fixed = int(np.prod([v for v in sizes.values() if v > 0]))
    try:
      self.resolve(fixed if num_devices is None else num_devices)
    except ValueError as e:
      raise ValueError(f"config.mesh: {e}") from None

  def resolve(self, num_devices: int) -> tuple[int, int, int]:
    sizes = [self.data, self.fsdp, self.tensor]
    if sizes.count(-1) > 1:
      raise ValueError(f"mesh shape {sizes} (data, fsdp, tensor): at most one axis may be -1")
    if any(s == 0 or s < -1 for s in sizes):
      raise ValueError(f"mesh shape {sizes} (data, fsdp, tensor): sizes must be positive or -1")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
      if num_devices % known:
        raise ValueError(
            f"mesh shape {sizes} (data, fsdp, tensor) does not divide the {num_devices} devices")
      sizes[sizes.index(-1)] = num_devices // known
    if int(np.prod(sizes)) != num_devices:
      raise ValueError(
          f"mesh shape {sizes} (data, fsdp, tensor) needs {int(np.prod(sizes))} devices, "
          f"found {num_devices}")
    return tuple(sizes)


def make_mesh(shape: MeshShape = MeshShape(), devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh in classic GSPMD (Auto) mode over all devices."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = shape.resolve(len(devices))
  if devices == list(jax.devices()):
    return jax.make_mesh(sizes, MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def logical_to_spec(names: Sequence[str | None] | None, shape: Sequence[int],
                    mesh: Mesh | jax.sharding.AbstractMesh,
                    rules: Mapping[str, Any] = LOGICAL_RULES) -> P:
  """PartitionSpec for one array from its logical axis names."""
  if not names:
    return P()
  if len(names) != len(shape):
    raise ValueError(f"logical axes {tuple(names)} do not match an array of shape {tuple(shape)}")
  used: set[str] = set()
  spec = []
  for name, size in zip(names, shape):
    if name is not None and name not in rules:
      raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(rules)}")
    rule = rules.get(name) if name is not None else None
    axes = () if rule is None else (rule,) if isinstance(rule, str) else tuple(rule)
    if not axes or used & set(axes) or size % int(np.prod([mesh.shape[a] for a in axes])):
      spec.append(None)
    else:
      spec.append(axes[0] if isinstance(rule, str) else axes)
      used.update(axes)
  return P(*spec)


def constrain(x: jax.Array, names: Sequence[str | None],
              rules: Mapping[str, Any] = LOGICAL_RULES) -> jax.Array:
  """`with_sharding_constraint` of x by its logical axis names, against the mesh in context
  (`under_mesh`, `jax.set_mesh`); x unchanged outside any mesh context."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(names, x.shape, mesh, rules))


def under_mesh(fn: Callable[..., Any], mesh: Mesh) -> Callable[..., Any]:
  """fn traced with `mesh` as the mesh in context, so that `constrain` inside it applies."""
  @functools.wraps(fn)
  def traced_under_mesh(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)
  return traced_under_mesh


def _logical_names(variable: nnx.Variable) -> tuple[str | None, ...] | None:
  meta = variable.get_metadata()
  return meta.get("out_sharding") or meta.get("sharding_names") or None


def state_shardings(state: nnx.State, mesh: Mesh,
                    rules: Mapping[str, str | None] = LOGICAL_RULES) -> Any:
  """NamedShardings (same tree as `state`) from the variables' logical-axis metadata."""
  def one(variable):
    if isinstance(variable, nnx.Variable):
      value = variable.get_value()
      return variable.replace(NamedSharding(
          mesh, logical_to_spec(_logical_names(variable), value.shape, mesh, rules)))
    return NamedSharding(mesh, P())
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def like_params_shardings(tree: Any, params: Any, param_shardings: Any, mesh: Mesh) -> Any:
  """Shardings for a tree (e.g. optimizer state) whose sub-trees mirror the params.

  Any sub-tree with the params' structure (Adam's mu and nu, EMA copies) gets the params'
  shardings; every other leaf (counts, scalars) is replicated.
  """
  params_def = jax.tree.structure(params)
  flat_param_shardings = jax.tree.leaves(param_shardings)
  replicated = NamedSharding(mesh, P())

  def is_params_like(x):
    try:
      return jax.tree.structure(x) == params_def
    except Exception:  # noqa: BLE001 - foreign leaf types are simply not param-like
      return False

  def one(x):
    if is_params_like(x):
      return jax.tree.unflatten(params_def, flat_param_shardings)
    return replicated
  return jax.tree.map(one, tree, is_leaf=is_params_like)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Rows split over ('data', 'fsdp'); every other dimension replicated."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Builds global arrays from this process's rows (multi-host: each host feeds its shard).

  On one process this is a plain device_put with the batch sharding. Scalars are replicated.
  """
  out = {}
  for key, value in local.items():
    value = np.asarray(value)
    if value.ndim == 0:
      out[key] = jax.device_put(value, replicated(mesh))
    else:
      out[key] = jax.make_array_from_process_local_data(batch_sharding(mesh, value.ndim), value)
  return out


def init_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None, local_device_ids: Sequence[int] | None = None,
                     cpu_collectives: str | None = None) -> None:
  """Starts multi-host JAX. On TPU pods and SLURM all arguments may be left None (auto-detect).

  `cpu_collectives="gloo"` enables cross-process collectives for CPU devices (tests, debugging).
  """
  if cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  if num_processes is not None and num_processes < 1:
    raise ValueError(f"num_processes must be >= 1, got {num_processes}")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id, local_device_ids=local_device_ids)
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())


def process_rows(mesh: Mesh, num_rows: int) -> slice:
  """The contiguous rows of a [num_rows, ...] global batch that this process must feed."""
  sharding = batch_sharding(mesh, 1)
  index_map = sharding.addressable_devices_indices_map((num_rows,))
  starts = [idx[0].start or 0 for idx in index_map.values()]
  stops = [num_rows if idx[0].stop is None else idx[0].stop for idx in index_map.values()]
  lo, hi = min(starts), max(stops)
  covered = sum(stop - start for start, stop in set(zip(starts, stops)))
  if covered != hi - lo:
    raise ValueError(f"this process's devices hold non-contiguous rows of the batch on mesh "
                     f"{dict(mesh.shape)}; order the mesh devices by process")
  return slice(lo, hi)


# ---------------------------------------------------------------------------------------------
# Multi-host coordination: process 0 writes shared files and talks to servers; every other
# process takes part in the collectives and waits for it.


def is_coordinator() -> bool:
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Every process waits here until all have arrived (nothing to wait for on one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def on_coordinator(fn: Callable[[], Any], what: str,
                   error_type: type[Exception] = RuntimeError) -> Any:
  """Runs `fn` on process 0 only and returns its result there (None elsewhere).

  Every process learns whether it succeeded (a broadcast, so this is also a barrier): process
  0 re-raises its exception, the others raise `error_type` naming `what`, so no process walks
  on into a collective that the failed one never reaches.
  """
  if jax.process_count() == 1:
    return fn()
  result, error = None, None
  if is_coordinator():
    try:
      result = fn()
    except Exception as e:  # noqa: BLE001 - re-raised below, after the others are told
      error = e
  failed = int(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
  if error is not None:
    raise error
  if failed:
    raise error_type(f"{what} failed on process 0 (its log has the error); process "
                     f"{jax.process_index()} stops too")
  return result


def to_host(value: Any) -> np.ndarray:
  """`value` as a host array. A jax.Array that spans other processes' devices is gathered
  (one array at a time, so device memory holds one extra replicated copy at most): every
  process must call this for the same arrays in the same order."""
  if isinstance(value, jax.Array) and not value.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(value, tiled=True))
  return np.asarray(jax.device_get(value))


def process_share(num_items: int) -> slice:
  """This process's contiguous block of `num_items` items split over the processes, the first
  `num_items % process_count` processes taking one more: concatenated in process order, the
  blocks are the items in order (the whole range on one process)."""
  count, index = jax.process_count(), jax.process_index()
  base, extra = divmod(num_items, count)
  start = index * base + min(index, extra)
  return slice(start, start + base + (index < extra))


def allgather_objects(value: Any) -> list[Any]:
  """Every process's `value`, in process order, on every process (a collective: all must call
  it, in the same order). Values travel pickled, padded to the longest, through one
  `process_allgather` of bytes (after one of the lengths): meant for host data such as rollout
  groups, between the processes of one job."""
  if jax.process_count() == 1:
    return [value]
  blob = np.frombuffer(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(blob.size))).reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:blob.size] = blob
  gathered = np.asarray(multihost_utils.process_allgather(padded))
  return [pickle.loads(gathered[p, :int(size)].tobytes()) for p, size in enumerate(sizes)]
