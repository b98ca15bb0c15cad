"""The sharded train step: microbatched value_and_grad, deterministic gradient reduction,
global-norm clip and AdamW, as one jitted program over a device mesh.

Layout. Parameters (fp32 master copies), optimizer moments and gradients are stored sharded
by their logical axis names (`composer_rl.model.sharding.param_shardings`, rules from the
experiment: `embed` over `fsdp` by default). Matmuls run in `ModelConfig.compute_dtype`
(bf16) with fp32 accumulation. Inside the step, a `shard_map` runs the *single-device*
program on each device's rows and shards: a layer's weights are gathered whole when the
layer loop reaches it (FSDP, `composer_rl.train.fsdp`), the same forward the sampler runs,
which is why every per-token log-prob is bitwise identical to the sampler's and to a
1-device run.

Determinism across device counts. A batch is split into microbatches of
`micro_batch_size` rows (the same program on the same shapes whatever the device count), one
gradient each, summed in one fixed balanced binary tree over the batch's microbatches
(`composer_rl.train.reduction`): the fsdp devices take neighbouring microbatches and reduce
each round's gradients inside the backward, keeping their own blocks (the tree's lowest
levels); a device sums its rounds as they are computed (O(log n) partial sums held); data
replicas combine theirs by recursive doubling (the top levels). When the number of
microbatches per device and the mesh's data and fsdp sizes are powers of two, loss,
gradients, gradient norm and updated parameters are bitwise identical on 1 and N devices.
`grad_reduce='psum'` uses XLA's reduce-scatter and all-reduce instead (sums in a
backend-chosen order, so the last bits can differ).
"""
import dataclasses
from typing import Any, Optional, Sequence, Tuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from composer_rl.model import sharding as shd
from composer_rl.model.config import ModelConfig
from composer_rl.model.transformer import Transformer, load_balancing_loss
from composer_rl.train import fsdp, losses, reduction
from composer_rl.train.batch import TrainBatch
from composer_rl.train.optimizer import (OptimizerConfig, clip_by_global_norm, make_optimizer,
                                         schedule)
from composer_rl.train.scoring import score_tokens

F32 = jnp.float32
GRAD_REDUCE = ("tree", "psum")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How one step turns a batch into an update.

  optimizer: AdamW, schedule and clipping (`OptimizerConfig`).
  loss: the objective (`losses.LossConfig`); policy_loss='sft' for supervised training.
  micro_batch_size: rows per gradient computation. A batch of B rows on D batch shards runs
    B / (D * micro_batch_size) microbatches per device, one after another (gradient
    accumulation); it bounds activation memory and fixes the program shape that makes the
    step bitwise across device counts.
  grad_reduce: 'tree' (fixed-order sum; bitwise across device counts when microbatches
    per device and devices are powers of two) or 'psum' (all-reduce; faster, not bitwise).
  """
  optimizer: OptimizerConfig = OptimizerConfig()
  loss: losses.LossConfig = losses.LossConfig()
  micro_batch_size: int = 1
  grad_reduce: str = "tree"

  def __post_init__(self):
    if self.micro_batch_size <= 0:
      raise ValueError(f"micro_batch_size must be positive, got {self.micro_batch_size}")
    if self.grad_reduce not in GRAD_REDUCE:
      raise ValueError(f"grad_reduce={self.grad_reduce!r}; choose one of {GRAD_REDUCE}")


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs from the device side.

  step: int32 number of optimizer updates applied so far (= the policy version).
  params: pure-dict tree of fp32 master weights (`nnx.merge(graphdef, params)` is the model).
  opt_state: optax AdamW state (moments sharded like params).
  rng: uint32[2] raw key data; advanced every step (for stochastic extensions; the loop's
    sampler keys derive from it too).
  ref_params: frozen reference policy for the KL penalty, or None.
  """
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  ref_params: Any = None


def _combine(a, b):
  ga, la, ma = a
  gb, lb, mb = b
  return (jax.tree.map(jnp.add, ga, gb), la + lb, losses.combine_metrics(ma, mb))


class TrainStep:
  """Builds and holds the compiled step for one model, train config and mesh.

  `step(state, batch) -> (state, metrics)` is the jitted update; `init_state(seed)` creates
  sharded initial state; `shard_batch(batch)` places a host batch on the mesh.
  """

  def __init__(self, model_config: ModelConfig, train_config: TrainConfig, mesh: Mesh,
               rules: Sequence[Tuple[str, Optional[str]]] = shd.DEFAULT_RULES):
    self.model_config, self.config, self.mesh = model_config, train_config, mesh
    abstract = nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(0)))
    self.graphdef, abstract_state = nnx.split(abstract)
    self.param_shardings = nnx.to_pure_dict(shd.param_shardings(abstract_state, mesh, rules))
    self.layout = fsdp.ParamLayout(
        jax.tree.map(lambda s: s.spec, self.param_shardings), nnx.to_pure_dict(abstract_state),
        nnx.to_pure_dict(shd.logical_names(abstract_state)), mesh, train_config.grad_reduce,
        rules)
    self.optimizer = make_optimizer(train_config.optimizer)
    self.lr_schedule = schedule(train_config.optimizer)
    self.replicated = NamedSharding(mesh, P())
    self.batch_axes = shd.batch_axes(mesh)
    self.num_shards = shd.num_batch_shards(mesh)
    abstract_params = nnx.to_pure_dict(abstract_state)
    abstract_opt = jax.eval_shape(self.optimizer.init, abstract_params)
    opt_shardings = optax.tree_map_params(
        self.optimizer, lambda _, s: s, abstract_opt, self.param_shardings,
        transform_non_params=lambda _: self.replicated)
    use_ref = train_config.loss.kl_coef > 0
    self.state_shardings = TrainState(
        step=self.replicated, params=self.param_shardings, opt_state=opt_shardings,
        rng=self.replicated, ref_params=self.param_shardings if use_ref else None)
    self.step = jax.jit(self._step, donate_argnums=0,
                        out_shardings=(self.state_shardings, self.replicated))

  # ---- state ---------------------------------------------------------------------------
  def _build_state(self, seed: int, params: Any = None) -> TrainState:
    if params is None:
      params = nnx.to_pure_dict(nnx.split(
          Transformer(self.model_config, rngs=nnx.Rngs(seed)))[1])
    ref = params if self.config.loss.kl_coef > 0 else None
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=self.optimizer.init(params),
                      rng=jax.random.key_data(jax.random.key(seed)), ref_params=ref)

  def init_state(self, seed: int, params: Any = None) -> TrainState:
    """Fresh state from `Transformer(..., rngs=nnx.Rngs(seed))`, or from given params (e.g.
    an SFT checkpoint). The reference policy (if the loss needs one) is the initial params."""
    return jax.jit(lambda p: self._build_state(seed, p),
                   out_shardings=self.state_shardings)(params)

  def abstract_state(self) -> TrainState:
    """ShapeDtypeStructs with shardings: the restore target for checkpoints."""
    shapes = jax.eval_shape(lambda: self._build_state(0))
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                        shapes, self.state_shardings)

  def shard_batch(self, batch: TrainBatch) -> TrainBatch:
    rows = batch.tokens.shape[0]
    per = self.num_shards * self.config.micro_batch_size
    if rows % per:
      raise ValueError(f"batch of {rows} rows does not split into {self.num_shards} shards x "
                       f"micro_batch_size={self.config.micro_batch_size}; pad it to a "
                       f"multiple of {per} (build_batch(num_rows=...))")
    return jax.device_put(batch, NamedSharding(self.mesh, P(self.batch_axes)))

  def model(self, params) -> Transformer:
    return nnx.merge(self.graphdef, params)

  # ---- the step ------------------------------------------------------------------------
  def _score(self, params, mb: TrainBatch):
    """The microbatch's scores from this device's parameter shards."""
    model = nnx.merge(self.graphdef, self.layout.outside_layers(params))
    return score_tokens(model, mb.tokens, mb.sampling, mb.segment_ids, mb.positions,
                        layer_gather=self.layout.layer_gather())

  def _micro_loss(self, params, ref_params, mb: TrainBatch, norms: losses.Normalizers):
    sc = self._score(params, mb)
    mask = mb.loss_mask * mb.rows_valid[:, None]
    ref_lp = None
    if self.config.loss.kl_coef > 0:
      ref_lp = jax.lax.stop_gradient(self._score(ref_params, mb).logprobs)
    loss, metrics = losses.policy_objective(sc.logprobs, mb.behaviour_logprobs, mb.advantages,
                                            mask, norms, self.config.loss, ref_lp, sc.entropy)
    if self.model_config.num_experts:
      # Load balancing per microbatch, weighted by its share of the batch's sequences.
      valid = (mb.segment_ids > 0) & (mb.rows_valid[:, None] > 0)
      aux = load_balancing_loss(sc.expert_ids, sc.router_probs, valid)
      aux = aux * jnp.sum(mb.rows_valid) / norms.num_seqs
      loss = loss + self.model_config.router_aux_loss_coef * aux
      metrics["router_aux"] = jax.lax.stop_gradient(aux)
    metrics["loss"] = jax.lax.stop_gradient(loss)
    return loss, metrics

  def _reduce(self, item, axis: str):
    """(grads, loss, metrics) summed over a mesh axis of batch shards, on every device."""
    def psum(x, axis):
      grads, loss = jax.lax.psum((x[0], x[1]), axis)
      return grads, loss, {k: (jax.lax.pmax(v, axis) if k.endswith("_max") else
                               jax.lax.pmin(v, axis) if k.endswith("_min") else
                               jax.lax.psum(v, axis)) for k, v in x[2].items()}
    return fsdp.group_sum(item, _combine, axis, self.mesh.shape[axis],
                          self.config.grad_reduce, psum)

  def _shard_grads(self, params, ref_params, norms, batch: TrainBatch):
    """Runs on one device: its rows ([1, m, 1, mbs, ...]: round j's microbatch) and
    parameter shards -> (gradient shards, loss, metrics, norm) reduced over all devices."""
    micro = jax.tree.map(lambda x: x.reshape(x.shape[1:2] + x.shape[3:]), batch)

    def one(mb):
      (loss, metrics), grads = jax.value_and_grad(self._micro_loss, has_aux=True)(
          params, ref_params, mb, norms)
      # The gradients left the backward already summed over the fsdp group (`fsdp.gather`).
      _, loss, metrics = self._reduce(({}, loss, metrics), "fsdp")
      return grads, loss, metrics

    local = reduction.streaming_tree_sum(one, micro, _combine)
    grads, loss, metrics = self._reduce(local, "data")
    return grads, loss, metrics, self.layout.global_norm(grads)

  def _step(self, state: TrainState, batch: TrainBatch):
    norms = losses.normalizers(batch.loss_mask * batch.rows_valid[:, None], batch.rows_valid)
    # Microbatch k = (i, j, f): data replica i, round j, fsdp device f (`composer_rl.train.fsdp`).
    d, f, mbs = self.mesh.shape["data"], self.mesh.shape["fsdp"], self.config.micro_batch_size
    rounds = batch.tokens.shape[0] // (d * f * mbs)
    batch = jax.tree.map(lambda x: x.reshape((d, rounds, f, mbs) + x.shape[1:]), batch)
    specs = self.layout.partition_specs()
    rep = lambda tree: jax.tree.map(lambda _: P(), tree)
    fn = jax.shard_map(
        self._shard_grads, mesh=self.mesh,
        in_specs=(specs, None if state.ref_params is None else specs, rep(norms),
                  jax.tree.map(lambda _: P("data", None, "fsdp"), batch)),
        out_specs=(specs, P(), P(), P()), check_vma=False)
    grads, loss, m, gnorm = fn(state.params, state.ref_params, norms, batch)
    grads = clip_by_global_norm(grads, gnorm, self.config.optimizer.max_grad_norm)
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              rng=jax.random.key_data(jax.random.fold_in(
                                  jax.random.wrap_key_data(state.rng), state.step)))
    tokens = jnp.maximum(m["tokens"], 1.0)
    metrics = {"loss": loss, "grad_norm": gnorm, "learning_rate": self.lr_schedule(state.step),
               "tokens": m["tokens"], "policy_loss": m["policy_loss"],
               "ratio_mean": m["ratio_sum"] / tokens, "ratio_max": m["ratio_max"],
               "ratio_min": m["ratio_min"], "ratio_not_one_frac": m["ratio_not_one"] / tokens,
               "clip_frac": m["clipped"] / tokens,
               "kl_behaviour": m["kl_behaviour_sum"] / tokens,
               "logp_mean": m["logp_sum"] / tokens,
               "entropy": m.get("entropy_sum", jnp.zeros(())) / tokens}
    for k in ("kl_ref", "router_aux"):
      if k in m:
        metrics[k] = m[k]
    return new_state, metrics


def make_train_step(model_config: ModelConfig, train_config: TrainConfig, mesh: Mesh,
                    rules=shd.DEFAULT_RULES) -> TrainStep:
  """The controller's entry point: see `TrainStep`."""
  return TrainStep(model_config, train_config, mesh, rules)
