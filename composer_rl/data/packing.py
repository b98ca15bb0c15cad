"""Packed fixed-length pretraining rows from documents, as a checkpointable grain.IterDataset.

documents -> seeded shuffle (a new order every epoch) -> repeat -> tokenize as
[BOS] + tokens + [EOS] -> split into chunks of at most `seq_len` tokens -> Grain's
first-fit packing into rows of exactly `seq_len` -> {"tokens", "segment_ids", "positions"}.

Row format (numpy int32, shape [seq_len]):
  tokens       token ids; padding is the tokenizer's PAD id (0 if it has none)
  segment_ids  1, 2, 3, ... for the pieces packed into this row, in order; 0 = padding
  positions    0, 1, 2, ... restarting at 0 at every segment (0 in padding)
  loss_weights 1 on a piece's real tokens, 0 on padding (row padding and `align` padding)

Alignment (`align`): every piece is padded up to a multiple of `align` tokens (inside its
own segment, weight 0), so every piece starts at a multiple of `align` in its row. With
`align` = the model's attention key block, a document's keys fill key blocks exactly as
they do when it is alone, which is what keeps packed training bitwise equal to unpacked
(`composer_rl.train.pretrain.alignment`; tested in tests/train/test_pretrain.py). The
padding sits after the piece's last token, so no real token ever attends to it.

Long documents: a document of more than `seq_len` tokens is cut into consecutive chunks of
`seq_len` (the last one shorter), and each chunk is its own segment starting at position 0:
the model never attends across a chunk boundary, so a row never depends on another row,
at the cost of losing the context before the cut (the same as a sliding window of
`seq_len`). The chunks of a document enter the packer consecutively, so they are in order
in the stream.

Packing is Grain's `FirstFitPackIterDataset` (segment ids from 1 with 0 for padding,
positions restarting per segment: exactly this format, renamed from `tokens_segment_ids` /
`tokens_positions`), with `shuffle_bins=False` so the stream order is the packing order.
Its iterator state is the parent's state at the start of the current group of bins plus the
row index within it; `set_state` re-packs that group, so a restored iterator continues at
exactly the next row. Tokenization runs in the MapDataset part (random access), so a
resumed run re-tokenizes at most `num_packing_bins` rows' worth of documents.
"""
from typing import Any, Dict, List, Optional, Sequence, Union

import grain
import numpy as np

from composer_rl.data.corpus import Document

_PACKED_KEYS = {"tokens": "tokens", "tokens_segment_ids": "segment_ids",
                "tokens_positions": "positions", "loss_weights": "loss_weights"}


class _Tokenize:
  """Document (or str) -> int32 [BOS] + tokenizer.encode(text) + [EOS] (picklable, for
  Grain worker processes)."""

  def __init__(self, tokenizer: Any, bos_id: Optional[int], eos_id: Optional[int]):
    self.tokenizer, self.bos_id, self.eos_id = tokenizer, bos_id, eos_id

  def __call__(self, doc: Union[Document, str]) -> np.ndarray:
    text = doc.text if isinstance(doc, Document) else doc
    ids = self.tokenizer.encode(text)
    pre = [] if self.bos_id is None else [self.bos_id]
    post = [] if self.eos_id is None else [self.eos_id]
    return np.asarray(pre + list(ids) + post, np.int32)


class _Chunk(grain.experimental.FlatMapTransform):
  """int32 token array -> [{"tokens", "loss_weights"}] chunks of at most seq_len tokens,
  each padded with `pad` up to a multiple of `align` (weight 0 there)."""

  def __init__(self, seq_len: int, max_fan_out: int, align: int, pad: int):
    self.seq_len, self.align, self.pad = seq_len, align, pad
    self.max_fan_out = max_fan_out

  def flat_map(self, tokens: np.ndarray) -> List[Dict[str, np.ndarray]]:
    out = []
    for s in range(0, len(tokens), self.seq_len):
      chunk = tokens[s:s + self.seq_len]
      extra = -len(chunk) % self.align
      out.append({"tokens": np.concatenate([chunk, np.full(extra, self.pad, np.int32)]),
                  "loss_weights": np.concatenate([np.ones(len(chunk), np.int32),
                                                  np.zeros(extra, np.int32)])})
    return out


def _rename(row: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  return {new: np.asarray(row[old], np.int32) for old, new in _PACKED_KEYS.items()}


def special_ids(tokenizer: Any, bos_id: Optional[int] = None, eos_id: Optional[int] = None,
                pad_id: Optional[int] = None):
  """(bos, eos, pad) ids: the given ones, else the tokenizer's BOS / EOS / PAD attributes
  (a tokenizer without BOS, e.g. Qwen3's, gets no BOS; PAD defaults to 0)."""
  bos = bos_id if bos_id is not None else getattr(tokenizer, "BOS", None)
  eos = eos_id if eos_id is not None else getattr(tokenizer, "EOS", None)
  pad = pad_id if pad_id is not None else getattr(tokenizer, "PAD", 0)
  if eos is None:
    raise ValueError("the tokenizer has no EOS attribute; pass eos_id (documents must be "
                     "separated by an end token)")
  return bos, eos, pad


def packed_rows(docs: Sequence[Union[Document, str]], tokenizer: Any, seq_len: int,
                seed: int, num_epochs: Optional[int] = None, *, num_packing_bins: int = 8,
                worker_count: int = 0, batch_size: Optional[int] = None,
                bos_id: Optional[int] = None,
                eos_id: Optional[int] = None, pad_id: Optional[int] = None,
                max_doc_tokens: int = 1 << 22, align: int = 1) -> grain.IterDataset:
  """Packed rows {"tokens", "segment_ids", "positions"} (int32 [seq_len]) of `docs`, or
  batches of them ([batch_size, seq_len]) when `batch_size` is given.

  Args:
    docs: documents (corpus Documents or plain strings), e.g. `Corpus.train`.
    tokenizer: an object with `encode(text) -> List[int]` and BOS / EOS / PAD attributes
      (e.g. ByteTokenizer); the explicit ids below override the attributes.
    seq_len: tokens per row.
    seed: document shuffle seed; every epoch is reshuffled from it.
    num_epochs: passes over `docs` (None = forever); the last row of a finite stream may be
      padded.
    num_packing_bins: rows first-fit packing fills at once. More bins -> less padding
      (short pieces fill earlier rows' gaps) but a document's pieces may spread over rows
      further apart; 8 keeps padding low on code (see BUILD_NOTES) and resume cheap.
    worker_count: Grain worker processes (`mp_prefetch`); 0 = in this process. With
      workers each packs its own slice of the documents and rows are interleaved, so the
      stream differs from worker_count=0 (still deterministic and checkpointable).
    batch_size: if given, rows are stacked into batches of this many (the remainder of a
      finite stream is dropped) before crossing to the worker processes: one transfer per
      batch instead of per row, which is what makes workers pay off (see BUILD_NOTES).
    bos_id, eos_id, pad_id: overrides of the tokenizer's special ids.
    max_doc_tokens: upper bound on a document's tokens (Grain's flat-map fan-out bound).
    align: pieces start at multiples of this many tokens (see the module docstring); must
      divide seq_len.
  """
  if seq_len <= 0 or num_packing_bins <= 0 or worker_count < 0 or (batch_size or 0) < 0:
    raise ValueError(f"seq_len and num_packing_bins must be positive and worker_count >= 0, "
                     f"got {seq_len}, {num_packing_bins}, {worker_count}")
  if align <= 0 or seq_len % align:
    raise ValueError(f"align={align} must be positive and divide seq_len={seq_len}")
  if not docs:
    raise ValueError("packed_rows needs at least one document")
  bos, eos, pad = special_ids(tokenizer, bos_id, eos_id, pad_id)
  ds = grain.MapDataset.source(list(docs)).shuffle(seed=seed).repeat(num_epochs)
  ds = ds.map(_Tokenize(tokenizer, bos, eos)).to_iter_dataset()
  ds = grain.experimental.FlatMapIterDataset(
      ds, _Chunk(seq_len, -(-max_doc_tokens // seq_len), align, pad))
  ds = grain.experimental.FirstFitPackIterDataset(
      ds, length_struct={"tokens": seq_len, "loss_weights": seq_len},
      num_packing_bins=num_packing_bins, shuffle_bins=False,
      padding_struct={"tokens": pad, "loss_weights": 0})
  ds = ds.map(_rename)
  if batch_size:
    ds = ds.batch(batch_size, drop_remainder=True)
  if worker_count:
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
  return ds


def padding_fraction(rows: Sequence[Dict[str, np.ndarray]]) -> float:
  """Fraction of positions that are padding (weight 0: row and alignment padding)."""
  total = sum(r["loss_weights"].size for r in rows)
  return float(sum(int((r["loss_weights"] == 0).sum()) for r in rows) / max(total, 1))
