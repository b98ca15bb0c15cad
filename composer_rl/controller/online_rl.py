"""Online RL from served sessions (issue #11): the server records what users do with the
policy; the trainer learns from those records and publishes weights the server follows.

`run(config, workdir)` is what `launch/train.py` runs for `kind='online_rl'`
(`experiments/online_rl.py`):

  1. SFT on demonstrations of the question-answer tasks (`composer_rl.online.tasks`), mostly
     verbose: the policy starts correct but wordy.
  2. The policy is published (`composer_rl.sync`, version 0) and served by the
     OpenAI-compatible server in this process (`composer_rl.serving`), which records every
     completion and feedback durably and follows each newly published version.
  3. Held-out preference rate *before*: the scripted user (a separate process with the
     official `openai` client, `online/scripted_user.py`) asks every held-out task greedily,
     without consent to training, and counts the replies it would accept.
  4. The scripted user works through the train tasks at temperature 1 and gives feedback
     (accepted only when the answer is concise and correct) while the trainer, step after
     step, ingests the records (`composer_rl.online.ingest`: sessions joined with feedback,
     rewards from `online.reward_weights`, consent / length / staleness limits), trains on
     the sessions it has not consumed (optionally mixed with simulated rollouts of the same
     tasks, `online.sim_fraction`), with the off-policy correction of the loss (importance
     ratio against the recorded behaviour log-probs), and publishes the new weights.
  5. Held-out preference rate *after*, as in 3, once the server serves the last version.

The last stdout line is a JSON summary with `preference_rate_before` / `_after`.
"""
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np
from flax import nnx

from composer_rl.controller import config as config_lib
from composer_rl.model import Transformer, hf_qwen3, inference_copy, sharding
from composer_rl.online import ingest, tasks as tasks_lib
from composer_rl.online.scripted_user import __file__ as USER_SCRIPT
from composer_rl.rollout import formats
from composer_rl.rollout.runner import RolloutConfig, RolloutRunner
from composer_rl.sampling.engine import Engine
from composer_rl.serving import loading
from composer_rl.serving.settings import ServeSettings
from composer_rl.serving.threaded import ThreadedServer
from composer_rl.sync.publisher import WeightPublisher
from composer_rl.train import advantages as adv_lib
from composer_rl.train import loop, losses, stages
from composer_rl.train.checkpoint import Checkpointer
from composer_rl.train.metrics import MetricsWriter
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.train_step import TrainConfig, make_train_step


def demonstrations(config, chat, system: str) -> List[Dict]:
  """SFT rows: (system, task) prompt, then the demonstrated answer (the only loss)."""
  c = config.sft
  rows = []
  for i in range(c.num_demos):
    t = tasks_lib.answer_task("train", i, config.tasks.seed)
    reply = tasks_lib.demo_answer(t, c.verbose_share, config.tasks.seed)
    prompt = chat.start(system, t.prompt)
    out = chat.tok.encode(reply) + [chat.end_of_turn]
    rows.append(dict(tokens=prompt + out, loss_mask=[0] * len(prompt) + [1] * len(out)))
  return rows


def sft_stage(config, mc, mesh, chat, system: str, metrics: MetricsWriter):
  """SFT from config.init_checkpoint's weights (or a fresh initialization)."""
  c = config.sft
  rows = demonstrations(config, chat, system)
  rng = np.random.default_rng(config.seed)
  return stages.sft_stage(
      mc, mesh, learning_rate=c.learning_rate, warmup_steps=c.warmup_steps, steps=c.steps,
      batch_size=c.batch_size, metrics=metrics, log_every=c.log_every, seed=config.seed,
      sample=lambda k: [rows[i] for i in rng.choice(len(rows), c.batch_size, replace=False)],
      init_params=(hf_qwen3.load_params(config.init_checkpoint) if config.init_checkpoint
                   else None)).params


def _user(base_url: str, model: str, tasks_path: str, out: str, **flags) -> subprocess.Popen:
  args = [sys.executable, USER_SCRIPT, f"--base_url={base_url}", f"--model={model}",
          f"--tasks={tasks_path}", f"--out={out}"]
  args += [f"--{k}={v}" for k, v in flags.items()]
  return subprocess.Popen(args)


def preference_rate(server: ThreadedServer, model: str, workdir: str, tag: str, num: int,
                    seed: int) -> float:
  """Held-out replies (greedy, no consent, no feedback) the scripted user accepts."""
  path = os.path.join(workdir, "heldout_tasks.jsonl")
  tasks_lib.write_tasks(path, [tasks_lib.answer_task("heldout", i, seed) for i in range(num)])
  out = os.path.join(workdir, f"eval_{tag}.jsonl")
  if os.path.exists(out):
    os.remove(out)
  rc = _user(server.base_url, model, path, out, temperature=0.0, feedback=0,
             consent="false", tag=f"eval-{tag}-").wait()
  if rc != 0:
    raise RuntimeError(f"the scripted user failed (exit {rc}) in evaluation {tag}")
  with open(out) as f:
    rows = [json.loads(line) for line in f]
  return float(np.mean([r["accepted"] for r in rows]))


def _simulated(config, engine: Engine, chat, system, params, mc, count: int, step: int):
  """`count` simulated sessions (groups of `online.sim_group_size`) of train tasks."""
  c, g = config.online, config.online.sim_group_size
  runner = RolloutRunner(engine, chat, RolloutConfig(
      system_prompt=system, max_turns=1, max_turn_tokens=config.online.max_tokens,
      temperature=c.temperature, seed=config.seed + 1000 + step),
      engine.place(inference_copy(params, mc)), version=step)
  jobs = []
  for k in range(-(-count // g)):
    task = tasks_lib.answer_task("train", (step * 7919 + k) % 100_000, config.tasks.seed)
    jobs += [(task.id, 10**6 + step * 1000 + k, tasks_lib.AnswerEnv(task)) for _ in range(g)]
  return runner.run(jobs[:count])


def _train_step(config, step, state, trajs):
  """One update on online (and simulated) sessions; returns (state, metrics)."""
  c = config.online
  rewards = np.asarray([t.reward for t in trajs], np.float32)
  # Online sessions share one baseline (their batch); simulated ones their own groups.
  gids = np.asarray([-1 if t.metrics.get("online") else t.group_id for t in trajs])
  adv = adv_lib.compute_advantages(c.advantage, rewards, gids)
  return stages.rl_update(step, state, trajs, adv, temperature=c.temperature)


def run(config, workdir: str) -> Dict:
  """Runs (or resumes, from `workdir/checkpoints`) the experiment; see module docstring.

  The trainer state is checkpointed after SFT's evaluation and after every step, with the
  ledger (the consumed session ids, the before-evaluation): a run killed at any point
  resumes without training on a session twice or skipping one it had trained on. The
  resumed weights are published as a new version (versions count publications, not
  steps), which the server follows."""
  config_lib.validate(config, "online_rl")
  os.makedirs(workdir, exist_ok=True)
  t_start = time.time()
  c = config.online
  chat = formats.from_config(config.chat, config.init_checkpoint, tools=None)
  mc = hf_qwen3.run_model_config(config.model, config.init_checkpoint, chat.tok.vocab_size)
  mesh = sharding.make_mesh({"data": -1})
  metrics = MetricsWriter(workdir)
  settings = ServeSettings.from_config(config, "online_rl")
  system, model = settings.system_prompt, settings.model_name
  step = make_train_step(mc, TrainConfig(
      optimizer=OptimizerConfig(learning_rate=c.learning_rate, warmup_steps=0,
                                total_steps=max(c.steps, 1), end_lr_ratio=1.0),
      loss=losses.LossConfig(policy_loss=c.policy_loss, clip_eps_low=c.clip_eps,
                             clip_eps_high=c.clip_eps_high)), mesh)
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=2)
  restored = ckpt.restore(step.abstract_state())
  if restored is not None:
    state, book, start = restored.state, dict(restored.ledger or {}), restored.step
    metrics.truncate_phase("online", start)
    print(f"composer_rl online: resumed at step {start} from {workdir}", flush=True)
  else:
    state = step.init_state(config.seed,
                            params=sft_stage(config, mc, mesh, chat, system, metrics))
    book, start = dict(consumed=[], before=None), 0
  publisher = WeightPublisher(os.path.join(workdir, "weights"), anchor_every=c.anchor_every)
  publish = lambda p: publisher.publish(inference_copy(p, mc))["version"]
  version = publish(state.params)
  records_dir = os.path.join(workdir, "records")
  service = loading.build_service(config, weights_dir=os.path.join(workdir, "weights"),
                                  records_dir=records_dir, model_name=model,
                                  settings=settings)
  server = ThreadedServer(service)
  sim_engine = Engine(nnx.eval_shape(lambda: Transformer(mc, rngs=nnx.Rngs(0))),
                      slots=8) if c.sim_fraction > 0 else None
  user = None
  try:
    if restored is None:  # step 0: the SFT policy and its evaluation, saved together
      book["before"] = preference_rate(server, model, workdir, "before",
                                       config.eval.num_heldout, config.tasks.seed)
      ckpt.save(0, state, ledger=book)
    print(f"composer_rl online: held-out preference rate before {book['before']:.3f}",
          flush=True)
    train_path = os.path.join(workdir, "train_tasks.jsonl")
    tasks_lib.write_tasks(train_path, [tasks_lib.answer_task("train", i, config.tasks.seed)
                                       for i in range(c.num_train_tasks)])
    stop_file = os.path.join(workdir, "user_stop")
    if os.path.exists(stop_file):
      os.remove(stop_file)
    # Conversation ids are unique per user process (a resumed run starts a new one).
    user = _user(server.base_url, model, train_path, os.path.join(workdir, "user_train.jsonl"),
                 temperature=c.temperature, feedback=1, consent="true", workers=c.user_workers,
                 stop_file=stop_file, max_tokens=c.max_tokens, tag=f"train-{os.getpid()}-")
    spec = ingest.RewardSpec(weights=dict(c.reward_weights), default=0.0)
    limits = ingest.IngestLimits(require_consent=True, max_tokens=mc.max_seq_len,
                                 max_age_versions=c.max_online_staleness)
    consumed = set(book["consumed"])
    n_sim = int(round(c.batch_size * c.sim_fraction))
    n_online = c.batch_size - n_sim
    published = [version]  # the last published weights version

    def fetch(k, state):
      t0 = time.time()
      while True:  # the trainer waits only for enough fresh sessions
        src = ingest.OnlineSessionSource(records_dir, spec, limits,
                                         current_version=published[0])
        fresh = [src[i] for i in range(len(src)) if src[i].session_id not in consumed]
        if len(fresh) >= n_online:
          # The newest sessions: the least stale (older ones age out by max_online_staleness).
          return fresh[-n_online:], src.stats, t0, time.time() - t0
        if user.poll() is not None:
          raise RuntimeError(f"the scripted user exited ({user.returncode}) during training")
        time.sleep(0.2)

    def update(k, state, item):
      online, ingest_stats, t0, wait_s = item
      sim = (_simulated(config, sim_engine, chat, system, state.params, mc, n_sim, k)
             if n_sim else [])
      state, out = _train_step(config, step, state, online + sim)
      published[0] = publish(state.params)
      consumed.update(t.session_id for t in online)
      book["consumed"] = sorted(consumed)
      out.update(
          accepted_rate_online=float(np.mean([t.reward > 0 for t in online])),
          reward_online=float(np.mean([t.reward for t in online])),
          reward_sim=float(np.mean([t.reward for t in sim])) if sim else 0.0,
          version_lag_mean=float(np.mean([t.metrics["version_lag"] for t in online])),
          version_lag_max=float(max(t.metrics["version_lag"] for t in online)),
          wait_seconds=wait_s, step_seconds=time.time() - t0, version=float(published[0]),
          **{f"ingest_{n}": float(v) for n, v in ingest_stats.items()})
      print(f"composer_rl online: step {k} accepted {out['accepted_rate_online']:.2f} "
            f"lag {out['version_lag_mean']:.1f} wait {wait_s:.1f}s", flush=True)
      return state, out
    state, _ = loop.run(state, start=start, steps=c.steps, phase="online", label="online RL",
                        fetch=fetch, update=update, metrics=metrics,
                        save=lambda done, state: ckpt.save(done, state, ledger=book))
    version = published[0]
    open(stop_file, "w").close()
    if user.wait(timeout=600) != 0:
      raise RuntimeError(f"the scripted user failed (exit {user.returncode})")
    t0 = time.time()
    while service.generator.version != version:  # the server follows the last version
      if time.time() - t0 > 120:
        raise RuntimeError(f"the server did not follow weights version {version}")
      time.sleep(0.2)
    after = preference_rate(server, model, workdir, "after", config.eval.num_heldout,
                            config.tasks.seed)
  finally:
    if user is not None and user.poll() is None:
      user.kill()
    ckpt.close()
    server.stop()
    service.close()
    metrics.close()
  summary = dict(seed=config.seed, steps=c.steps, batch_size=c.batch_size,
                 sim_fraction=c.sim_fraction, preference_rate_before=book["before"],
                 preference_rate_after=after, final_version=version,
                 sessions_consumed=len(consumed), heldout=config.eval.num_heldout,
                 total_seconds=time.time() - t_start)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f)
  print(json.dumps(summary), flush=True)
  return summary
