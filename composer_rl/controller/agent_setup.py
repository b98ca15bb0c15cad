"""What the agent-RL stages share, built once from a validated config: the tokenizer and
chat layout, the train mesh and the inference meshes (`controller.placement`), the engines,
the environment settings, task lookup, rollout runners and the metrics writer."""
import dataclasses
from typing import Dict, List

import jax
from flax import nnx

from composer_rl.controller import config as config_lib
from composer_rl.controller import placement
from composer_rl.env.harness import EnvConfig, make_env
from composer_rl.env.policies import make_policy
from composer_rl.env.tasks import get_task
from composer_rl.model import Transformer, hf_qwen3, inference_copy, sharding
from composer_rl.rollout import compaction as compaction_lib, formats
from composer_rl.rollout.runner import RolloutConfig, RolloutRunner
from composer_rl.rollout.summary_judge import SummaryJudgeConfig
from composer_rl.sampling.engine import Engine
from composer_rl.train.metrics import MetricsWriter


class Setup:
  """Everything the stages share, built once from the config. `worker=True` is a remote
  rollout worker's view: no train mesh, one engine over all of its devices."""

  def __init__(self, config, workdir: str, worker: bool = False):
    config_lib.validate(config, "agent_rl")  # defaults filled in: fields are read directly
    self.config, self.workdir = config, workdir
    c, ckpt = config.chat, config.init_checkpoint
    # A tokenizer trained at run time lives where remote rollout workers find it too.
    home = config.rl.shared_dir if config.rl.rollouts == "remote" else workdir
    self.chat = formats.from_config(c, ckpt, config.env.tools, home,
                                    corpus=self.session_texts)
    if not worker:  # what the viewer needs to read the run's tokens and calls
      formats.write_run_chat(workdir, self.chat)
    self.tok = self.chat.tok
    self.model_config = hf_qwen3.run_model_config(config.model, ckpt, self.tok.vocab_size)
    if worker:
      inference_meshes = [sharding.make_mesh({"data": -1})]
      self.mesh = None
    else:
      if jax.process_count() > 1:
        raise ValueError(
            f"agent RL is one controller but this job has {jax.process_count()} processes: "
            "run it under Pathways (--distributed=pathways) or on one host, with rollouts in "
            "separate jobs (rl.rollouts='remote', launch/rollout_worker.py)")
      plan = placement.carve(jax.devices(), config.mesh.train_fraction,
                             config.mesh.inference_meshes, config.mesh.train_fsdp)
      self.mesh, inference_meshes = plan.train_mesh, plan.inference_meshes
    self.inference_meshes = inference_meshes
    self._eval_engines: Dict[int, Engine] = {}  # max_seq_len -> a wider-window engine
    self.env_config = self._env_config(self.chat.call_syntax)
    abstract = nnx.eval_shape(lambda: Transformer(self.model_config, rngs=nnx.Rngs(0)))
    self.engines = [Engine(abstract, slots=config.rl.slots, prefill_chunk=config.rl.prefill_chunk,
                           mesh=m) for m in inference_meshes]
    self.metrics = MetricsWriter(workdir)

  def _env_config(self, call_syntax: str) -> EnvConfig:
    e = self.config.env
    return EnvConfig(call_syntax=call_syntax, max_turns=e.max_turns,
                     grade_timeout_s=e.grade_timeout_s, system_prompt=e.system_prompt,
                     tools=tuple(e.tools))

  def session_texts(self, call_syntax: str, num_sessions: int = 256) -> List[str]:
    """What a tokenizer trained at run time learns from (`chat.bpe_vocab_size`): the
    system prompt, and the task, calls and tool outputs of the SFT demonstrator's sessions
    on the first train tasks (no held-out task), played in the sandbox in `call_syntax`."""
    c = self.config
    env_config = self._env_config(call_syntax)
    texts = [c.env.system_prompt]
    for i in range(min(num_sessions, c.sft.num_demos)):
      task = self.task("train", i)
      env = make_env(task, env_config)
      policy = make_policy(c.sft.demo_policy, **dict(c.sft.demo_policy_args))
      policy.reset(task, call_syntax)
      obs = env.reset()
      texts.append(obs)
      for _ in range(c.env.max_turns):
        action = policy.act(obs)
        res = env.step(action)
        obs = res.observation
        texts += [action, obs]
        if res.done:
          break
    return texts

  def init_params(self):
    """The checkpoint's weights (host arrays) when config.init_checkpoint is set, else None
    (a fresh initialization)."""
    ckpt = self.config.init_checkpoint
    return hf_qwen3.load_params(ckpt) if ckpt else None

  def task(self, split: str, index: int):
    t = self.config.tasks
    return get_task(t.family, split, index, t.seed, **({"path": t.dir} if t.dir else {}))

  def sampler_params(self, train_params, engine):
    """The trainer's params as engine `engine` (an index or an `Engine`) computes with
    them: compute-dtype copies, moved (resharded) onto its inference mesh."""
    eng = self.engines[engine] if isinstance(engine, int) else engine
    return eng.place(inference_copy(train_params, self.model_config))

  def eval_engine(self, max_seq_len: int = 0) -> Engine:
    """The engine evaluation samples with: engine 0, or (for a `max_seq_len` other than
    the model's) an engine over the same parameters with a longer KV cache, built once."""
    if not max_seq_len or max_seq_len == self.model_config.max_seq_len:
      return self.engines[0]
    if max_seq_len not in self._eval_engines:
      mc = self.model_config.replace(max_seq_len=int(max_seq_len))
      abstract = nnx.eval_shape(lambda: Transformer(mc, rngs=nnx.Rngs(0)))
      self._eval_engines[max_seq_len] = Engine(
          abstract, slots=self.config.rl.slots, prefill_chunk=self.config.rl.prefill_chunk,
          mesh=self.inference_meshes[0])
    return self._eval_engines[max_seq_len]

  @property
  def summary_judge(self) -> SummaryJudgeConfig:
    """`config.rl.summary_judge` (empty = off)."""
    return SummaryJudgeConfig(**self.config.rl.summary_judge.to_dict())

  def compaction(self, mode: str = "") -> compaction_lib.CompactionConfig:
    """`config.rl.compaction` as a `CompactionConfig` (empty = disabled); `mode` other
    than '' replaces its mode (and enables it unless 'none')."""
    cfg = compaction_lib.CompactionConfig(**self.config.rl.compaction.to_dict())
    if mode:
      cfg = dataclasses.replace(cfg, mode=mode, enabled=cfg.enabled or mode != "none")
    return cfg

  def rollout_config(self, greedy: bool, seed: int, context_mode: str = "") -> RolloutConfig:
    c = self.config.rl
    return RolloutConfig(max_turns=self.config.env.max_turns, max_turn_tokens=c.max_turn_tokens,
                         temperature=1.0 if greedy else c.temperature,
                         top_k=1 if greedy else c.top_k, top_p=1.0 if greedy else c.top_p,
                         seed=seed, tool_workers=c.tool_workers,
                         decode_steps=c.decode_steps,
                         compaction=self.compaction(context_mode),
                         # RL only: evaluation reports the task reward.
                         summary_judge=SummaryJudgeConfig() if greedy else self.summary_judge)

  def runner(self, params, version: int, greedy: bool, seed: int, engine=0,
             context_mode: str = "") -> RolloutRunner:
    eng = self.engines[engine] if isinstance(engine, int) else engine
    return RolloutRunner(eng, self.chat, self.rollout_config(greedy, seed, context_mode),
                         self.sampler_params(params, eng), version)

  def train_env(self, task_index: int):
    return make_env(self.task("train", task_index), self.env_config)
