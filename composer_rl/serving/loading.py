"""Building the serving stack from an experiment config, and following published weights.

`build_service(config, ...)` builds everything `ServingService` needs: the chat format of
`config.chat` (default byte) and the model of `config.model`, or of `config.init_checkpoint`
(a converted Hugging Face checkpoint: architecture, tokenizer, weights); its weights are
the newest version published under `--weights_dir` (`composer_rl.sync`, followed afterwards
by a `WeightFollower` thread), else the params of an Orbax train checkpoint
(`--checkpoint`), else the init checkpoint's, else fresh ones with `config.seed`; and the
settings of `config.serve` (`ServeSettings`).
"""
import json
import os
import sys
import threading
from typing import Any, Callable, List, Optional, Tuple

from absl import logging

from composer_rl.serving.chat_template import ChatTemplate
from composer_rl.serving.generator import Generator
from composer_rl.serving.records import RecordLog
from composer_rl.serving.service import ServingService
from composer_rl.serving.settings import ServeSettings


# ---- weight follower --------------------------------------------------------------------

class WeightFollower:
  """Polls a published-weights root every `poll_s` and hands each new verified version
  to the generator (which switches between completions, never inside one)."""

  def __init__(self, subscriber, generator: Generator, place: Callable, poll_s: float):
    self.sub, self.generator, self.place, self.poll_s = subscriber, generator, place, poll_s
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="weight-follower", daemon=True)
    self.errors = 0

  def start(self) -> "WeightFollower":
    self._thread.start()
    return self

  def poll_once(self) -> Optional[int]:
    v = self.sub.poll()
    if v is not None:
      self.generator.set_params(self.place(self.sub.snapshot()), self.sub.version)
      logging.warning("serve: following weights version %d", self.sub.version)
    return v

  def _run(self) -> None:
    while not self._stop.wait(self.poll_s):
      try:
        self.poll_once()
      except Exception as e:  # pylint: disable=broad-except  (keep serving the old weights)
        self.errors += 1
        logging.warning("serve: weight follower: %s: %s", type(e).__name__, e)

  def stop(self) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join(timeout=30)


# ---- building from a config -------------------------------------------------------------

def _checkpoint_steps(path: str) -> Tuple[str, List[int]]:
  """(the CheckpointManager directory, its steps newest first) for a workdir, a checkpoints
  directory, or one step directory."""
  path = os.path.abspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"--checkpoint: no directory {path}")
  if os.path.isdir(os.path.join(path, "state")):  # one step folder
    base, name = os.path.split(path)
    if name.isdigit():
      return base, [int(name)]
  if os.path.isdir(os.path.join(path, "checkpoints")):
    path = os.path.join(path, "checkpoints")
  steps = sorted((int(n) for n in os.listdir(path)
                  if n.isdigit() and os.path.isdir(os.path.join(path, n, "state"))),
                 reverse=True)
  if not steps:
    raise FileNotFoundError(f"--checkpoint: no train checkpoint (step folders with a "
                            f"'state' item) under {path}")
  return path, steps


def restore_params(checkpoint: str, model_config, sharding=None) -> Tuple[Any, int]:
  """(params, step) of the newest readable train checkpoint under `checkpoint`.

  Only `state.params` is read (an Orbax partial restore into the model's abstract
  parameters), whatever optimizer or train step wrote the checkpoint; a step whose `meta`
  item is missing or inconsistent (a partial save) or whose params do not restore is
  reported and skipped. A shape or dtype mismatch with `config.model` names the leaf."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from composer_rl.model import Transformer  # pylint: disable=g-import-not-at-top
  base, steps = _checkpoint_steps(checkpoint)
  abstract = nnx.to_pure_dict(nnx.split(nnx.eval_shape(
      lambda: Transformer(model_config, rngs=nnx.Rngs(0))))[1])
  sh = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = {"params": jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract)}
  errors = []
  for step in steps:
    where = os.path.join(base, str(step))
    try:
      meta_path = os.path.join(where, "meta", "metadata")
      with open(meta_path) as f:
        meta = json.load(f)
      if int(meta.get("step", -1)) != step:
        raise ValueError("missing or inconsistent meta item (partial checkpoint)")
      with ocp.PyTreeCheckpointer() as ckpt:
        got = ckpt.restore(os.path.join(where, "state"), args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True))
      params = got["params"]
      want = jax.tree.map(lambda s: (tuple(s.shape), str(s.dtype)), abstract)
      have = jax.tree.map(lambda a: (tuple(a.shape), str(a.dtype)), params)
      if want != have:
        raise ValueError("checkpoint params do not match config.model")
      return params, step
    except Exception as e:  # pylint: disable=broad-except
      first = str(e).splitlines()[0] if str(e) else ""
      msg = f"skipping checkpoint step {step} at {where}: {type(e).__name__}: {first}"
      print(f"composer_rl serve: {msg}", file=sys.stderr, flush=True)
      errors.append(msg)
  raise FileNotFoundError(f"no readable train checkpoint under {checkpoint}: "
                          + "; ".join(errors))


def chat_and_model(config):
  """(chat format, ModelConfig, checkpoint weights or None) of a serve config: its `chat`
  section (default: the byte format) and `init_checkpoint` (a converted Hugging Face
  checkpoint: its architecture, tokenizer and weights), as every training kind reads them."""
  from composer_rl.model import hf_qwen3  # pylint: disable=g-import-not-at-top
  from composer_rl.rollout import formats  # pylint: disable=g-import-not-at-top
  get = config.get if hasattr(config, "get") else lambda k, d=None: getattr(config, k, d)
  ckpt = get("init_checkpoint", "") or ""
  chat = formats.from_config(get("chat", None), ckpt, tools=None)
  mc = hf_qwen3.run_model_config(dict(config.model), ckpt, chat.tok.vocab_size)
  return chat, mc, (hf_qwen3.load_params(ckpt) if ckpt else None)


def resolve_records_dir(settings: ServeSettings, records_dir: Optional[str],
                        workdir: Optional[str]) -> str:
  """--records_dir, else config.serve.records_dir, else <workdir>/records, else
  ~/.cache/composer_rl/serve/<model>/records."""
  if records_dir:
    return records_dir
  if settings.records_dir:
    return settings.records_dir
  if workdir:
    return os.path.join(workdir, "records")
  return os.path.join(os.path.expanduser("~"), ".cache", "composer_rl", "serve",
                      settings.model_name, "records")


def build_service(config, checkpoint_dir: Optional[str] = None,
                  weights_dir: Optional[str] = None, records_dir: Optional[str] = None,
                  workdir: Optional[str] = None, model_name: str = "",
                  settings: Optional[ServeSettings] = None) -> ServingService:
  """The service for an experiment config (see the module docstring). `model_name`: the
  default served name when config.serve has none (launch/serve.py passes the file stem)."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from composer_rl.model import Transformer, inference_copy  # pylint: disable=g-import-not-at-top
  from composer_rl.sampling.engine import Engine  # pylint: disable=g-import-not-at-top

  settings = settings or ServeSettings.from_config(config, model_name)
  chat, mc, init = chat_and_model(config)
  tok = chat.tok
  abstract = nnx.eval_shape(lambda: Transformer(mc, rngs=nnx.Rngs(0)))
  engine = Engine(abstract, slots=settings.slots, prefill_chunk=settings.prefill_chunk,
                  top_logprobs=settings.top_logprobs)
  version, params = 0, None
  subscriber = None
  if weights_dir:
    from composer_rl.sync.subscriber import WeightSubscriber  # pylint: disable=g-import-not-at-top
    template = jax.eval_shape(lambda p: inference_copy(p, mc), nnx.to_pure_dict(engine.params))
    subscriber = WeightSubscriber(weights_dir, template)
    if subscriber.poll() is not None:
      params, version = subscriber.snapshot(), int(subscriber.version)
  if params is None and checkpoint_dir:
    master, version = restore_params(checkpoint_dir, mc)
    params = inference_copy(master, mc)
  if params is None and init is not None:
    params = inference_copy(init, mc)
  if params is None:
    seed = int(config.get("seed", 0)) if hasattr(config, "get") else 0
    params = inference_copy(nnx.to_pure_dict(nnx.split(
        Transformer(mc, rngs=nnx.Rngs(seed)))[1]), mc)
  generator = Generator(engine, engine.place(params), version, tok,
                        max_waiting=settings.max_waiting)
  template = ChatTemplate(chat, default_system=settings.system_prompt)
  records = RecordLog(resolve_records_dir(settings, records_dir, workdir),
                      max_file_bytes=settings.record_file_bytes)
  follower = None
  if subscriber is not None:
    follower = WeightFollower(subscriber, generator, engine.place, settings.poll_s).start()
  service = ServingService(generator, template, records, settings, tok, follower)
  if settings.warmup:
    service.warmup()
  return service
