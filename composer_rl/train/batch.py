"""`TrainBatch`: the fixed-shape arrays one train step consumes, and how to build one.

Token-level records (a rollout `Trajectory`, an SFT example) mark each token with whether
the model sampled it. The step scores *predictions*: column t of every [B, S-1] array
belongs to predicting token t+1 (the layout of `composer_rl.train.scoring.Scores`), so the
builders below shift the per-token mask / log-probs / versions left by one.
"""
from typing import Any, Dict, Optional, Sequence

import flax.struct
import jax
import numpy as np

from composer_rl.sampling.head import RowSampling


@flax.struct.dataclass
class TrainBatch:
  """One step's data (leading axis = sequences; padding rows have rows_valid 0).

  tokens: [B, S] int32, right-padded sequences (prompt, model turns, tool observations).
  segment_ids: [B, S] int32, 1 on real tokens, 0 on padding.
  positions: [B, S] int32 RoPE positions (0..len-1).
  loss_mask: [B, S-1] fp32, 1 where the predicted token t+1 was sampled by the model.
  behaviour_logprobs: [B, S-1] fp32 log-prob the sampler recorded for token t+1 (0 if masked).
  advantages: [B] fp32 per-sequence advantage (ignored by SFT).
  rows_valid: [B] fp32, 0 for rows added only to fill the batch shape.
  versions: [B, S-1] int32 policy version that sampled token t+1 (-1 if not sampled).
  sampling: per-row `RowSampling` the tokens were sampled under (the trainer scores the
    same transformed distribution; SFT uses temperature 1, no top-k/top-p).
  """
  tokens: jax.Array
  segment_ids: jax.Array
  positions: jax.Array
  loss_mask: jax.Array
  behaviour_logprobs: jax.Array
  advantages: jax.Array
  rows_valid: jax.Array
  versions: jax.Array
  sampling: RowSampling

  @property
  def shape(self):
    return self.tokens.shape


def _get(rec: Any, name: str, default=None):
  if isinstance(rec, dict):
    return rec.get(name, default)
  return getattr(rec, name, default)


def build_batch(records: Sequence[Any], seq_len: int, num_rows: Optional[int] = None,
                advantages: Optional[Sequence[float]] = None, temperature: float = 1.0,
                top_k: int = 0, top_p: float = 1.0) -> TrainBatch:
  """Packs token-level records into a right-padded numpy `TrainBatch`.

  Args:
    records: objects or dicts with `tokens` and `loss_mask` (per token, 1 = sampled by the
      model), and optionally `logprobs` and `versions` per token (a rollout `Trajectory`
      has all four; an SFT example needs only the first two).
    seq_len: S, the padded length (<= the model's max_seq_len). Longer records raise.
    num_rows: B >= len(records); extra rows are padding (rows_valid 0). Default len(records).
    advantages: per-record advantages (default 0).
    temperature, top_k, top_p: the sampling transform the records were sampled under; a
      record with its own `sampling` ({"temperature", "top_k", "top_p"}, e.g. an online
      session served with a client's settings) is scored under that instead.
  """
  n = len(records)
  rows = n if num_rows is None else int(num_rows)
  if rows < n:
    raise ValueError(f"num_rows={rows} < {n} records")
  tokens = np.zeros((rows, seq_len), np.int32)
  seg = np.zeros((rows, seq_len), np.int32)
  mask = np.zeros((rows, seq_len - 1), np.float32)
  blp = np.zeros((rows, seq_len - 1), np.float32)
  ver = np.full((rows, seq_len - 1), -1, np.int32)
  for i, rec in enumerate(records):
    toks = np.asarray(_get(rec, "tokens"), np.int32)
    m = np.asarray(_get(rec, "loss_mask"), np.float32)
    if len(toks) > seq_len:
      raise ValueError(f"record {i} has {len(toks)} tokens > seq_len={seq_len}")
    if len(m) != len(toks):
      raise ValueError(f"record {i}: loss_mask has {len(m)} entries for {len(toks)} tokens")
    L = len(toks)
    tokens[i, :L], seg[i, :L] = toks, 1
    mask[i, :L - 1] = m[1:]  # the first token is never predicted
    lps = _get(rec, "logprobs")
    if lps is not None and len(lps):
      blp[i, :L - 1] = np.where(m[1:] > 0, np.asarray(lps, np.float32)[1:], 0.0)
    vs = _get(rec, "versions")
    if vs is not None and len(vs):
      ver[i, :L - 1] = np.asarray(vs, np.int32)[1:]
  adv = np.zeros((rows,), np.float32)
  if advantages is not None:
    adv[:n] = np.asarray(advantages, np.float32)
  valid = np.zeros((rows,), np.float32)
  valid[:n] = 1.0
  positions = np.broadcast_to(np.arange(seq_len, dtype=np.int32), (rows, seq_len)).copy()
  sampling = RowSampling(temperature=np.full((rows,), temperature, np.float32),
                         top_k=np.full((rows,), top_k, np.int32),
                         top_p=np.full((rows,), top_p, np.float32))
  for i, rec in enumerate(records):
    own = _get(rec, "sampling")
    if own:
      sampling.temperature[i] = own["temperature"]
      sampling.top_k[i] = own["top_k"]
      sampling.top_p[i] = own["top_p"]
  return TrainBatch(tokens=tokens, segment_ids=seg, positions=positions, loss_mask=mask,
                    behaviour_logprobs=blp, advantages=adv, rows_valid=valid, versions=ver,
                    sampling=sampling)


def build_packed_batch(rows: Sequence[Dict[str, Any]], num_rows: Optional[int] = None
                       ) -> TrainBatch:
  """Packed pretraining rows (`composer_rl.data.packing`) -> a next-token `TrainBatch`.

  Each row holds several documents: `tokens`, `segment_ids` (1, 2, ... per document, 0 on
  padding), `positions` (restarting at 0 for each document) and optionally `loss_weights`
  (0 on alignment padding inside a segment), all [S]. Attention never crosses a document
  (the forward masks keys of other segments) and neither does the loss: predicting token
  t+1 from token t counts only when both are in the same document and t+1 is a real
  token, so the first token of a document is never predicted from the previous one's last.
  """
  n = len(rows)
  b = n if num_rows is None else int(num_rows)
  if b < n or not n:
    raise ValueError(f"num_rows={b} must be >= {n} rows (and there must be at least one)")
  s = len(rows[0]["tokens"])
  tokens, seg, positions, weights = (np.zeros((b, s), np.int32) for _ in range(4))
  for i, row in enumerate(rows):
    row = dict(row)
    row.setdefault("loss_weights", np.asarray(row["segment_ids"]) > 0)
    for name, out in (("tokens", tokens), ("segment_ids", seg), ("positions", positions),
                      ("loss_weights", weights)):
      a = np.asarray(row[name], np.int32)
      if a.shape != (s,):
        raise ValueError(f"packed row {i}: {name} has shape {a.shape}, want ({s},)")
      out[i] = a
  mask = ((seg[:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1]) & (weights[:, 1:] > 0)
          ).astype(np.float32)
  valid = np.zeros((b,), np.float32)
  valid[:n] = 1.0
  return TrainBatch(tokens=tokens, segment_ids=seg, positions=positions, loss_mask=mask,
                    behaviour_logprobs=np.zeros((b, s - 1), np.float32),
                    advantages=np.zeros((b,), np.float32), rows_valid=valid,
                    versions=np.full((b, s - 1), -1, np.int32),
                    sampling=RowSampling(temperature=np.ones((b,), np.float32),
                                         top_k=np.zeros((b,), np.int32),
                                         top_p=np.ones((b,), np.float32)))


def staleness(batch: TrainBatch, current_version: int) -> np.ndarray:
  """Per sampled token: current_version - version that sampled it (host-side metric)."""
  v = np.asarray(batch.versions)
  m = np.asarray(batch.loss_mask) > 0
  return (current_version - v)[m]
