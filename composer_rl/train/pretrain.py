"""Continued pretraining ("mid-training") on code: the trainer's `mode='pretrain'`.

corpus (`composer_rl.data.corpus`: sources, filters, secret scrubbing, dedup, a held-out
split by repository) -> packed rows (`composer_rl.data.packing`: documents shuffled per
epoch, [BOS] text [EOS], packed into fixed rows with per-document segment ids and
positions) -> next-token `TrainBatch`es (`batch.build_packed_batch`: attention and loss
never cross a document) -> the trainer's sharded step with policy_loss 'sft' (token-mean
NLL over every predicted token).

Held-out perplexity is measured by repository: each held-out repository's documents are
packed on their own (one epoch, unshuffled), so a row never mixes repositories, and
exp(NLL per token) is reported per repository and over all of them (token-weighted).

The `corpus` config section (every field optional):
  dirs            directory roots whose immediate entries are repositories; empty and no
                  shards given = the Python standard library and site-packages on this
                  machine (`corpus.stdlib_and_site_packages_roots`).
  jsonl, array_record   shard paths ({"repo", "path", "text"} records).
  languages, min_bytes, max_bytes, heldout_fraction, near_dup_threshold, max_files
                  -> `composer_rl.data.corpus.CorpusConfig` (seed = the experiment's).
  tokenizer       registry name in TOKENIZERS ('byte'; 'hf' = the init checkpoint's).
  eval_max_rows   held-out rows the perplexity evaluation reads (spread over repositories).
The built corpus is cached in `workdir/corpus/` (keyed by the settings), so a resumed run
trains on the same documents without re-reading and re-deduplicating the files.
"""
import hashlib
import json
import math
import os
from typing import Any, Callable, Dict, List, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_rl.data import corpus as corpus_lib
from composer_rl.data import packing
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.train.batch import TrainBatch, build_packed_batch
from composer_rl.train.scoring import score_tokens

CORPUS_FIELDS = ("languages", "min_bytes", "max_bytes", "heldout_fraction",
                 "near_dup_threshold", "max_files")
SHARD_SOURCES = ("jsonl", "array_record")


def _hf_tokenizer(init_checkpoint: str):
  from composer_rl.data.hf_tokenizer import HfTokenizer  # pylint: disable=g-import-not-at-top
  from composer_rl.model import hf_qwen3  # pylint: disable=g-import-not-at-top
  if not init_checkpoint:
    raise ValueError("corpus.tokenizer='hf' needs config.init_checkpoint (a converted "
                     "checkpoint with its hf_files/)")
  return HfTokenizer(os.path.join(init_checkpoint, hf_qwen3.HF_FILES_DIR))


# corpus.tokenizer -> fn(init_checkpoint) -> tokenizer with encode() and BOS/EOS/PAD ids
TOKENIZERS: Dict[str, Callable[[str], Any]] = {
    "byte": lambda _: ByteTokenizer(), "hf": _hf_tokenizer}


def corpus_settings(section, seed: int) -> Tuple[List[Tuple[str, Tuple[str, ...]]],
                                                 corpus_lib.CorpusConfig]:
  """(sources, CorpusConfig) from the `corpus` config section."""
  section = dict(section or {})
  kw = {k: (tuple(section[k]) if k == "languages" else section[k])
        for k in CORPUS_FIELDS if k in section}
  if kw.get("max_files") == 0:
    kw["max_files"] = None
  sources = [(name, tuple(section.get(name) or ())) for name in SHARD_SOURCES
             if section.get(name)]
  dirs = tuple(section.get("dirs") or ())
  if dirs or not sources:
    sources.insert(0, ("dirs", dirs or tuple(corpus_lib.stdlib_and_site_packages_roots())))
  return sources, corpus_lib.CorpusConfig(seed=seed, **kw)


def _doc_json(d: corpus_lib.Document) -> str:
  return json.dumps(dict(repo=d.repo, path=d.path, language=d.language, text=d.text))


def load_corpus(section, seed: int, workdir: str) -> corpus_lib.Corpus:
  """Builds the corpus, or reads it back from `workdir/corpus/` if built with the same
  settings (a resumed run must train on exactly the documents the first run did)."""
  sources, cfg = corpus_settings(section, seed)
  key = hashlib.sha256(json.dumps([sources, repr(cfg)]).encode()).hexdigest()[:16]
  d = os.path.join(workdir, "corpus", key)
  if os.path.exists(os.path.join(d, "stats.json")):
    splits = {}
    for split in ("train", "heldout"):
      with open(os.path.join(d, f"{split}.jsonl")) as f:
        splits[split] = [corpus_lib.Document(**json.loads(line)) for line in f]
    with open(os.path.join(d, "stats.json")) as f:
      return corpus_lib.Corpus(splits["train"], splits["heldout"], json.load(f))
  built = corpus_lib.build_corpus(sources, cfg)
  if not built.train or not built.heldout:
    raise ValueError(f"the corpus {sources} has {len(built.train)} train and "
                     f"{len(built.heldout)} held-out documents after filtering; both must be "
                     "non-empty (more files, or another corpus.heldout_fraction)")
  if jax.process_index() == 0:  # every process builds the same corpus; one writes it
    os.makedirs(d, exist_ok=True)
    for split in ("train", "heldout"):
      with open(os.path.join(d, f"{split}.jsonl.tmp"), "w") as f:
        f.writelines(_doc_json(x) + "\n" for x in getattr(built, split))
      os.replace(os.path.join(d, f"{split}.jsonl.tmp"), os.path.join(d, f"{split}.jsonl"))
    with open(os.path.join(d, "stats.json"), "w") as f:  # written last: marks it complete
      json.dump(built.stats, f)
  return built


def alignment(model_config) -> int:
  """Where packed documents must start for packing to be bitwise: a multiple of the
  attention key block. A document's keys then fill key blocks exactly as they do when the
  document is alone (blocks of other documents are fully masked for its queries and add
  exact zeros to the block-ordered value sum)."""
  return model_config.key_block


def train_rows(corpus: corpus_lib.Corpus, tokenizer, seq_len: int, seed: int, align: int):
  """The infinite, checkpointable stream of packed train rows."""
  return packing.packed_rows(corpus.train, tokenizer, seq_len, seed, align=align)


def heldout_rows(corpus: corpus_lib.Corpus, tokenizer, seq_len: int, max_rows: int,
                 align: int) -> Dict[str, List[Dict[str, np.ndarray]]]:
  """repo -> packed rows of its held-out documents (one epoch, in corpus order), at most
  `max_rows` rows in all, spread evenly over the repositories (sorted by name)."""
  by_repo: Dict[str, List[corpus_lib.Document]] = {}
  for doc in corpus.heldout:
    by_repo.setdefault(doc.repo, []).append(doc)
  per_repo = max(1, max_rows // max(len(by_repo), 1))
  out = {}
  for repo in sorted(by_repo)[:max_rows]:
    rows = []
    for row in packing.packed_rows(by_repo[repo], tokenizer, seq_len, seed=0, num_epochs=1,
                                   align=align):
      rows.append(row)
      if len(rows) == per_repo:
        break
    out[repo] = rows
  return out


def make_nll_fn(step_fn) -> Callable[[Any, TrainBatch], Tuple[jax.Array, jax.Array]]:
  """jit fn(params, batch) -> (summed NLL [B], predicted tokens [B]) per row, the same
  forward and token head as the train step (temperature 1, full distribution)."""
  def nll(params, batch: TrainBatch):
    model = nnx.merge(step_fn.graphdef, params)
    sc = score_tokens(model, batch.tokens, batch.sampling, batch.segment_ids, batch.positions)
    m = batch.loss_mask * batch.rows_valid[:, None]
    return -jnp.sum(jnp.where(m > 0, sc.logprobs, 0.0), axis=1), jnp.sum(m, axis=1)
  return jax.jit(nll)


def heldout_perplexity(nll_fn, step_fn, params, rows_by_repo: Dict[str, Sequence[Dict]],
                       batch_rows: int) -> Dict[str, Any]:
  """Perplexity exp(NLL / token) over all held-out rows and per repository."""
  flat = [(repo, r) for repo, rows in rows_by_repo.items() for r in rows]
  sums: Dict[str, List[float]] = {repo: [0.0, 0.0] for repo in rows_by_repo}
  for i in range(0, len(flat), batch_rows):
    chunk = flat[i:i + batch_rows]
    batch = build_packed_batch([r for _, r in chunk], num_rows=batch_rows)
    nll, count = jax.device_get(nll_fn(params, step_fn.shard_batch(batch)))
    for j, (repo, _) in enumerate(chunk):
      sums[repo][0] += float(nll[j])
      sums[repo][1] += float(count[j])
  total_nll = sum(s[0] for s in sums.values())
  total = sum(s[1] for s in sums.values())
  return dict(perplexity=math.exp(total_nll / max(total, 1.0)), tokens=int(total),
              repos=len(sums),
              per_repo={repo: round(math.exp(s[0] / max(s[1], 1.0)), 4)
                        for repo, s in sorted(sums.items())})
