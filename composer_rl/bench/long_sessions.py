"""How long the long-task family's sessions are against the window: the scripted
demonstrator of `experiments/tiny_compaction.py` (its task family and demonstrator) on
train tasks in the real sandbox, with compaction at the experiment's settings and
without a window. Prints one JSON object.

  python -m composer_rl.bench.long_sessions            # 100 tasks, ~30 s on 2 cores
  python -m composer_rl.bench.long_sessions --tasks=20
"""
import json
import os
import sys
import time

from absl import app, flags
import numpy as np

from composer_rl.controller import config as kinds
from composer_rl.controller.agent_eval import context_stats
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env.harness import EnvConfig, make_env
from composer_rl.env.policies import make_policy
from composer_rl.env.tasks import get_task
from composer_rl.rollout import compaction as compaction_lib
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.scripted import scripted_trajectory

_TASKS = flags.DEFINE_integer("tasks", 100, "train tasks of the experiment's family")
_FIX_PROBS = flags.DEFINE_list("fix_probs", ["1.0", "0.4"], "demonstrator fix probabilities")


def experiment_config(smoke: bool = False):
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.path.insert(0, os.path.join(root, "experiments"))
  import tiny_compaction  # pylint: disable=g-import-not-at-top
  return tiny_compaction.agent_config(smoke)


def main(_):
  c = experiment_config()
  kinds.validate(c, "agent_rl")  # defaults filled in
  chat = ChatFormat(ByteTokenizer())
  env = EnvConfig(call_syntax="tool_compact", max_turns=c.env.max_turns,
                  system_prompt=c.env.system_prompt, tools=tuple(c.env.tools))
  comp = compaction_lib.CompactionConfig(**dict(c.rl.compaction))
  window = c.model.max_seq_len
  tasks = [get_task(c.tasks.family, "train", i, c.tasks.seed) for i in range(_TASKS.value)]
  demo_args = dict(c.sft.demo_policy_args)
  t0, out = time.time(), dict(window=window, tasks=len(tasks))

  def run(fix_prob, **kw):
    args = dict(demo_args, fix_prob=fix_prob)
    return [scripted_trajectory(make_policy(c.sft.demo_policy, **args), t, make_env(t, env),
                                chat, **kw)
            for t in tasks]
  for fp in map(float, _FIX_PROBS.value):
    trajs = run(fp, compaction=comp, max_seq_len=window)
    out[f"fix_prob_{fp}"] = dict(reward=float(np.mean([t.reward for t in trajs])),
                                 **context_stats(trajs))
  free = run(1.0)  # no window: how long the sessions would be
  out["no_window_fix_prob_1.0"] = dict(
      reward=float(np.mean([t.reward for t in free])),
      share_over_window=float(np.mean([len(t.tokens) > window for t in free])),
      **context_stats(free))
  out["seconds"] = round(time.time() - t0, 1)
  print(json.dumps(out))


if __name__ == "__main__":
  app.run(main)
