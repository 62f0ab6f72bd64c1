"""Named host arrays as one entry of SGLang's `/update_weights_from_tensor` request, without
torch on this side.

The server unpickles each entry of `serialized_named_tensors` into a list of (name, tensor)
pairs and hands them to its model's weight loader. This module writes that pickle directly,
opcode by opcode (protocol 4), so that unpickling builds every CPU tensor from its raw bytes
with torch calls that take positional arguments only:

    torch.Tensor.reshape(torch.Tensor.view(torch.ByteTensor(
        torch.ByteStorage.from_buffer(<bytes>)), torch.<dtype>), <shape>)

so the trainer needs neither torch nor a CUDA IPC handle: the bytes travel in the HTTP body
(same node: over loopback, no disk). The entry is base64 text, as the JSON body carries it.
Only little-endian hosts are supported (the raw bytes are the arrays' native order).
"""
from __future__ import annotations

import base64
import io
import struct
import sys
from typing import Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np

# numpy dtype -> the torch dtype's attribute name
TORCH_DTYPES: Mapping[np.dtype, str] = {
    np.dtype(np.float32): "float32",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
    np.dtype(np.float16): "float16",
}

# pickle protocol 4 opcodes (the `pickle` module's own names)
_PROTO, _STOP = b"\x80\x04", b"."
_EMPTY_LIST, _MARK, _APPENDS = b"]", b"(", b"e"
_SHORT_BINUNICODE, _BINUNICODE = b"\x8c", b"X"
_BINBYTES, _BINBYTES8 = b"B", b"\x8e"
_BININT, _TUPLE, _TUPLE1, _TUPLE2 = b"J", b"t", b"\x85", b"\x86"
_STACK_GLOBAL, _REDUCE = b"\x93", b"R"


def _text(value: str) -> bytes:
  data = value.encode("utf-8")
  if len(data) < 256:
    return _SHORT_BINUNICODE + bytes([len(data)]) + data
  return _BINUNICODE + struct.pack("<I", len(data)) + data


def _global(module: str, name: str) -> bytes:
  return _text(module) + _text(name) + _STACK_GLOBAL


def _call(fn: bytes, *args: bytes) -> bytes:
  """fn(*args): the callable, the arguments as one tuple, REDUCE."""
  packed = {1: b"".join(args) + _TUPLE1, 2: b"".join(args) + _TUPLE2}.get(
      len(args), _MARK + b"".join(args) + _TUPLE)
  return fn + packed + _REDUCE


def _raw(data: bytes) -> bytes:
  if len(data) < 1 << 32:
    return _BINBYTES + struct.pack("<I", len(data)) + data
  return _BINBYTES8 + struct.pack("<Q", len(data)) + data


def _shape(shape: Sequence[int]) -> bytes:
  return _MARK + b"".join(_BININT + struct.pack("<i", int(d)) for d in shape) + _TUPLE


def _tensor(array: np.ndarray) -> bytes:
  if array.dtype not in TORCH_DTYPES:
    raise ValueError(f"weight sync: dtype {array.dtype} has no torch counterpart here; "
                     f"expected one of {sorted(str(d) for d in TORCH_DTYPES)}")
  if array.size == 0:
    raise ValueError(f"weight sync: an empty array (shape {array.shape}) cannot be sent")
  flat = _call(_global("torch", "ByteTensor"),
               _call(_global("torch", "ByteStorage.from_buffer"),
                     _raw(np.ascontiguousarray(array).tobytes())))
  typed = _call(_global("torch", "Tensor.view"), flat,
                _global("torch", TORCH_DTYPES[array.dtype]))
  return _call(_global("torch", "Tensor.reshape"), typed, _shape(array.shape))


def named_tensors_pickle(named: Iterable[tuple[str, np.ndarray]]) -> bytes:
  """The pickle of [(name, torch tensor), ...] for `named` (see the module docstring)."""
  if sys.byteorder != "little":
    raise RuntimeError("weight sync by tensor needs a little-endian host")
  out = io.BytesIO()
  out.write(_PROTO + _EMPTY_LIST + _MARK)
  for name, array in named:
    out.write(_text(name) + _tensor(np.asarray(array)) + _TUPLE2)
  out.write(_APPENDS + _STOP)
  return out.getvalue()


def serialized_entry(named: Iterable[tuple[str, np.ndarray]]) -> str:
  """One `serialized_named_tensors` entry: the pickle, base64 text."""
  return base64.b64encode(named_tensors_pickle(named)).decode("ascii")


def buckets(named: Mapping[str, np.ndarray], max_bytes: int) -> list[list[tuple[str, np.ndarray]]]:
  """The tensors in order, in consecutive buckets of at most `max_bytes` raw bytes each (a
  larger tensor alone in its own): one request each, so no body holds the whole model."""
  out: list[list[tuple[str, np.ndarray]]] = []
  size = 0
  for name, array in named.items():
    if not out or (size + array.nbytes > max_bytes and out[-1]):
      out.append([])
      size = 0
    out[-1].append((name, array))
    size += array.nbytes
  return out
