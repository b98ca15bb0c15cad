"""Does a model copy what it read? Three measurements, each printing one JSON object.

`--mode=probe`: SFT the tiny_bugfix architecture from scratch on synthetic rows and log the
loss on the copied tokens (ln 19 ~ 2.94 = chance over the 19 upper-case letters; for
typed_parts ln 5 ~ 1.6, and ln 4 ~ 1.39 is a copy of one of the four parts at random):
  fixed    `xx STRING yy STRING`: the copy sits at a fixed offset
  sparse   four `mI.py: part = 'XY'` lines in code, then `key ` and the 8 letters (the
           loss on those 9 tokens only)
  parts    data.copy_curriculum part rows: `1|kI = 'X'` module lines (any letter) among
           filler, then each part recalled by name in a shuffled order
  typed_parts  the same with part I from keychain.PART_ALPHABETS[I] (the family's parts)
  repeat   data.copy_curriculum rows with one name per block (each value repeated at once,
           the first curriculum: learns to copy the latest value, not the named one)
  dense    data.copy_curriculum rows (up to four names, recalled in a shuffled order)
  python -m composer_rl.bench.copying --mode=probe --rows=dense --steps=400   # ~3 min

`--mode=policy`: does a keychain experiment's saved SFT policy (its RL step-0 checkpoint)
copy? The mean probability it gives the right letter at every trained part position, on
fresh copy rows of the experiment's kind and on its demonstrations' contexts (1/5 = the
part's type alone, no copy).
  python -m composer_rl.bench.copying --mode=policy --workdir=/tmp/tiny_compaction/compaction

`--mode=rollouts`: how well a keychain experiment's sessions copied the parts, from a
workdir's saved rollouts: the share of parts a summary restates correctly (against what
the session read), the share of sessions that set the parts, and exact answers.
  python -m composer_rl.bench.copying --mode=rollouts \
      --rollouts='/tmp/tiny_compaction/compaction/rollouts/rl_step_*.jsonl'
"""
import glob
import json
import os
import re
import tempfile
import time

from absl import app, flags
import jax
import numpy as np

from composer_rl.bench.long_sessions import experiment_config
from composer_rl.controller import agent_rl, agent_setup, agent_sft
from composer_rl.rollout.session import Trajectory
from composer_rl.data import copy_curriculum
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env.tasks import keychain
from composer_rl.model import sharding
from composer_rl.model.config import ModelConfig
from composer_rl.model.hf_qwen3 import build_model
from composer_rl.rollout import compaction as compaction_lib
from composer_rl.train import sft
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.scoring import score_tokens

_MODE = flags.DEFINE_enum("mode", "probe", ["probe", "policy", "rollouts"], "what to measure")
_ROWS = flags.DEFINE_enum("rows", "dense",
                          ["fixed", "sparse", "parts", "typed_parts", "repeat", "dense"],
                          "probe rows")
_STEPS = flags.DEFINE_integer("steps", 400, "probe SFT steps")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "probe row length (tokens)")
_MAX_GAP = flags.DEFINE_integer("max_gap", 35, "parts rows: most filler bytes after a part")
_ROLLOUTS = flags.DEFINE_string("rollouts", "", "glob of rollout JSONL files")
_WORKDIR = flags.DEFINE_string("workdir", "", "policy: a tiny_compaction run's workdir")

_PART = re.compile(r"(k\d) = '([A-Z])'")


def _fixed(rng, tok, seq_len):
  p = "".join(rng.choice(list(copy_curriculum.UPPER), 8))
  pre, ans = tok.encode(f"xx {p} yy "), tok.encode(p)
  return dict(tokens=pre + ans, loss_mask=[0] * len(pre) + [1] * len(ans))


def _sparse(rng, tok, seq_len):
  parts = ["".join(rng.choice(list(copy_curriculum.UPPER), 2)) for _ in range(4)]
  filler = lambda: "".join(rng.choice(list("abcdefghij klmnopqrstuvwxyz\n"),
                                      size=int(rng.integers(10, 41))))
  text = "".join(f"m{i + 1}.py: part = '{p}'\n{filler()}\n" for i, p in enumerate(parts))
  pre, ans = tok.encode(text + "key "), tok.encode("".join(parts) + "\n")
  return dict(tokens=pre + ans, loss_mask=[0] * len(pre) + [1] * len(ans))


def probe(rows: str, steps: int, seq_len: int = 256, max_gap: int = 35) -> dict:
  tok = ByteTokenizer()
  mc = ModelConfig(vocab_size=tok.vocab_size, d_model=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=32, d_ff=384, max_seq_len=seq_len, row_tile=32,
                   compute_dtype="float32")
  make = {"fixed": _fixed, "sparse": _sparse,
          "parts": lambda r, t, n: copy_curriculum.part_record(r, t, n, max_gap=max_gap),
          "typed_parts": lambda r, t, n: copy_curriculum.part_record(
              r, t, n, keychain.PART_ALPHABETS, max_gap=max_gap),
          "repeat": lambda r, t, n: copy_curriculum.copy_record(r, t, n, names_per_block=1),
          "dense": lambda r, t, n: copy_curriculum.copy_record(r, t, n)}[rows]
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  step = sft.make_sft_step(mc, OptimizerConfig(learning_rate=2e-3, warmup_steps=20,
                                               total_steps=steps), mesh)
  state, rng, t0, curve = step.init_state(0), np.random.default_rng(0), time.time(), {}
  for k in range(steps):
    batch = sft.sft_batch([make(rng, tok, seq_len) for _ in range(8)], seq_len)
    state, m = step.step(state, step.shard_batch(batch))
    if k % 25 == 0 or k == steps - 1:
      curve[k] = round(float(m["loss"]), 3)
  below = [k for k, v in curve.items() if v < 0.5 * np.log(19)]
  return dict(rows=rows, steps=steps, seq_len=seq_len, copy_loss=curve,
              chance=round(float(np.log(19)), 3),
              first_logged_step_below_half_chance=below[0] if below else None,
              seconds=round(time.time() - t0, 1))


def _letter_probs(model, tok, records, seq_len) -> dict:
  """p(right letter) at the trained positions of `records` that hold a part letter."""
  batch = sft.sft_batch(records, seq_len)
  sc = score_tokens(model, batch.tokens, batch.sampling, batch.segment_ids, batch.positions)
  lp, toks = np.asarray(sc.logprobs), np.asarray(batch.tokens)[:, 1:]
  sel = (np.asarray(batch.loss_mask) > 0) & np.isin(toks, tok.encode(keychain.ALPHABET))
  p = np.exp(lp[sel])
  return dict(letters=int(sel.sum()), p_right_mean=round(float(p.mean()), 3),
              share_p_right_over_half=round(float((p > 0.5).mean()), 3))


def policy(workdir: str, rows: int = 8, contexts: int = 24, smoke: bool = False) -> dict:
  """The saved SFT policy of `workdir` (a run of the experiment, its smoke variant with
  `smoke`), scored on copy rows and demonstration contexts."""
  demo_files = glob.glob(os.path.join(workdir, "demos_*.jsonl"))
  if not demo_files:
    raise ValueError(f"no demonstrations (demos_*.jsonl) in {workdir!r}")
  c = experiment_config(smoke)
  with tempfile.TemporaryDirectory() as tmp:
    s = agent_setup.Setup(c, tmp)
    params = agent_sft.saved_sft_params(s, agent_rl.make_rl_step(s), workdir)
  model, n = build_model(s.model_config, jax.device_get(params)), s.model_config.max_seq_len
  copy_rows = copy_curriculum.copy_records(
      np.random.default_rng(12345), s.tok, rows, n, c.sft.copy_rows_kind,
      **dict(c.sft.copy_rows_args))
  with open(demo_files[0]) as f:
    demos = [Trajectory.from_json(json.loads(line)) for line in f]
  segs = [r for d in demos for r in compaction_lib.segment_records(d)][:contexts]
  return dict(workdir=workdir, copy_rows=_letter_probs(model, s.tok, copy_rows, n),
              demo_contexts=_letter_probs(model, s.tok, segs, n))


def rollouts(pattern: str) -> dict:
  files = sorted(glob.glob(pattern))
  if not files:
    raise ValueError(f"no rollout files match {pattern!r}")
  n = edits = exact = right = restated = 0
  for path in files:
    with open(path) as f:
      for line in f:
        r = json.loads(line)
        n += 1
        read = dict(m.groups() for o in r["observations"] for m in [_PART.search(o)] if m)
        for seg in r.get("segments") or []:
          for k, v in _PART.findall(seg["summary"]):
            restated += 1
            right += read.get(k) == v
        for t in r["turn_texts"]:
          if '"edit"' in t:
            edits += 1
            got = dict(_PART.findall(t.split('","')[-1]))
            exact += len(read) == 4 and all(got.get(k) == v for k, v in read.items())
  return dict(files=len(files), sessions=n, edit_rate=round(edits / max(n, 1), 3),
              summary_parts=restated, summary_part_accuracy=round(right / max(restated, 1), 3),
              exact_answers=exact)


def main(_):
  if _MODE.value == "probe":
    out = probe(_ROWS.value, _STEPS.value, _SEQ_LEN.value, _MAX_GAP.value)
  else:
    out = policy(_WORKDIR.value) if _MODE.value == "policy" else rollouts(_ROLLOUTS.value)
  print(json.dumps(out))


if __name__ == "__main__":
  app.run(main)
