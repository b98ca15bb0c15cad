"""Safetensors files read and written tensor by tensor, with numpy (bfloat16 included).

The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
byte offsets) and the raw little-endian bytes. `safetensors.safe_open(framework="numpy")`
cannot return bfloat16, the dtype published Qwen3 checkpoints ship in, and conversion
should not need torch, so these few lines do it: reads seek to one tensor at a time and
writes produce one tensor at a time, so memory holds one tensor, not a checkpoint.
"""
import dataclasses
import json
import os
import struct
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ml_dtypes
import numpy as np

_ST_TO_NP = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32),
             "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16)}
_NP_TO_ST = {v: k for k, v in _ST_TO_NP.items()}
NAME_TO_NP = {"float32": _ST_TO_NP["F32"], "float16": _ST_TO_NP["F16"],
              "bfloat16": _ST_TO_NP["BF16"], "float64": _ST_TO_NP["F64"]}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class ConversionError(ValueError):
  """The checkpoint cannot be converted; the message names the tensor, field or file."""


@dataclasses.dataclass(frozen=True)
class _Entry:
  file: str
  dtype: np.dtype
  shape: Tuple[int, ...]
  start: int  # absolute byte offset in the file
  nbytes: int


def _read_header(path: str) -> Tuple[Dict[str, Any], int]:
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) != 8:
      raise ConversionError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw)
    if n > 100 << 20:
      raise ConversionError(f"{path}: not a safetensors file (header length {n})")
    try:
      header = json.loads(f.read(n))
    except ValueError as e:
      raise ConversionError(f"{path}: unreadable safetensors header: {e}") from None
  return header, 8 + n


class SafetensorsReader:
  """Lazy reader over a Hugging Face checkpoint directory (single file or sharded)."""

  def __init__(self, hf_dir: str):
    index = os.path.join(hf_dir, INDEX_FILE)
    if os.path.exists(index):
      with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(hf_dir, SINGLE_FILE)):
      files = [SINGLE_FILE]
    else:
      raise ConversionError(f"{hf_dir}: neither {INDEX_FILE} nor {SINGLE_FILE} found")
    self.entries: Dict[str, _Entry] = {}
    for name in files:
      path = os.path.join(hf_dir, name)
      if not os.path.exists(path):
        raise ConversionError(f"{index}: lists shard {name}, which does not exist")
      header, base = _read_header(path)
      for key, e in header.items():
        if key == "__metadata__":
          continue
        if e["dtype"] not in _ST_TO_NP:
          raise ConversionError(f"{path}: tensor {key!r} has unsupported dtype {e['dtype']!r}; "
                                f"supported: {sorted(_ST_TO_NP)}")
        begin, end = e["data_offsets"]
        self.entries[key] = _Entry(path, _ST_TO_NP[e["dtype"]], tuple(e["shape"]),
                                   base + begin, end - begin)

  def names(self) -> List[str]:
    return sorted(self.entries)

  def dtypes(self) -> set:
    return {e.dtype for e in self.entries.values()}

  def get(self, name: str, shape: Optional[Sequence[int]] = None) -> np.ndarray:
    """The tensor `name`, read from disk now; checks its shape against `shape`."""
    e = self.entries.get(name)
    if e is None:
      raise ConversionError(f"checkpoint is missing tensor {name!r}")
    if shape is not None and tuple(shape) != e.shape:
      raise ConversionError(f"tensor {name!r} has shape {list(e.shape)}, expected "
                            f"{list(shape)} from config.json")
    count = int(np.prod(e.shape, dtype=np.int64))
    if count * e.dtype.itemsize != e.nbytes:
      raise ConversionError(f"{e.file}: tensor {name!r} byte size does not match its shape")
    with open(e.file, "rb") as f:
      f.seek(e.start)
      a = np.fromfile(f, dtype=e.dtype.newbyteorder("<"), count=count)
    return a.astype(e.dtype, copy=False).reshape(e.shape)


def write_safetensors(path: str, specs: Sequence[Tuple[str, Tuple[int, ...], np.dtype]],
                      produce: Callable[[str], np.ndarray]) -> None:
  """Writes tensors `specs` (name, shape, dtype) to `path`, calling `produce(name)` for each
  one only when it is written (so only one is ever in memory)."""
  header: Dict[str, Any] = {"__metadata__": {"format": "pt"}}
  offset = 0
  for name, shape, dtype in specs:
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    header[name] = dict(dtype=_NP_TO_ST[np.dtype(dtype)], shape=list(shape),
                        data_offsets=[offset, offset + n])
    offset += n
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for name, shape, dtype in specs:
      a = np.ascontiguousarray(produce(name))
      if a.shape != tuple(shape) or a.dtype != np.dtype(dtype):
        raise ConversionError(f"internal: {name} came out {a.dtype}{list(a.shape)}, "
                              f"expected {np.dtype(dtype)}{list(shape)}")
      f.write(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
