"""Hugging Face Qwen3 / Qwen3-MoE import and export, checked against `transformers` itself.

Tiny random models are built with the reference implementation (PyTorch CPU, f32, nothing
downloaded) and saved with `save_pretrained`; composer_rl imports them and must give the same
logits (f32, exact numerics) within 1e-5 of the logit scale and the same MoE expert choices;
export must give back every tensor's bytes; the parity suite must be clean on them.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from composer_rl.model import KVCache  # noqa: E402
from composer_rl.model import hf_qwen3  # noqa: E402
from composer_rl.parity.suite import ParityRunner, run_suite  # noqa: E402
from composer_rl.sampling.sampler import SamplingConfig  # noqa: E402

REL_BOUND = 1e-5
F32_OVERRIDES = dict(compute_dtype="float32", exact_numerics=True, max_seq_len=32, row_tile=8)


def _dense_hf_config():
  return transformers.Qwen3Config(
      vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
      max_position_embeddings=64, tie_word_embeddings=True, initializer_range=0.1,
      rope_parameters={"rope_type": "default", "rope_theta": 50000.0})


def _moe_hf_config():
  return transformers.Qwen3MoeConfig(
      vocab_size=160, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
      num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
      mlp_only_layers=[1], max_position_embeddings=64, tie_word_embeddings=False,
      initializer_range=0.1, rms_norm_eps=1e-6)


def _save(model_cls, hf_config, path, dtype=torch.float32, seed=0, **save_kw):
  torch.manual_seed(seed)
  model = model_cls._from_config(hf_config, attn_implementation="eager").to(dtype).eval()
  for p in model.parameters():  # norms are ones at init: randomize them so a swapped norm shows
    if p.ndim == 1:
      with torch.no_grad():
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
  model.save_pretrained(str(path), **save_kw)
  return model


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
  """Qwen3, tied embeddings, sharded into several files with the index."""
  d = tmp_path_factory.mktemp("qwen3")
  model = _save(transformers.Qwen3ForCausalLM, _dense_hf_config(), d, max_shard_size="40KB")
  assert os.path.exists(d / hf_qwen3.INDEX_FILE)
  return d, model


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
  """Qwen3-MoE, 3 layers (MoE, dense, MoE), 8 experts top-2, single safetensors file."""
  d = tmp_path_factory.mktemp("qwen3_moe")
  model = _save(transformers.Qwen3MoeForCausalLM, _moe_hf_config(), d, seed=1)
  assert os.path.exists(d / hf_qwen3.SINGLE_FILE)
  return d, model


def _tokens(vocab, b=2, s=19, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, (b, s)).astype(np.int32)


def _composer_forward(cfg, params, tokens):
  model = hf_qwen3.build_model(cfg, params)
  graphdef, state = nnx.split(model)
  b, s = tokens.shape

  @jax.jit
  def fwd(state, tokens):
    m = nnx.merge(graphdef, state)
    out = m.forward(tokens, jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s)),
                    KVCache.init(cfg, b), jnp.zeros((b,), jnp.int32))
    return m.logits(out.hidden.reshape(b * s, -1)).reshape(b, s, -1), out.expert_ids
  logits, ids = fwd(state, jnp.asarray(tokens))
  return np.asarray(logits), np.asarray(ids)


def _rel_diff(ours, ref):
  diff, scale = float(np.max(np.abs(ours - ref))), float(np.max(np.abs(ref)))
  print(f"\nmax|logits diff| = {diff:.3e}, max|logits| = {scale:.3e}, ratio = {diff / scale:.3e}")
  return diff, scale


def test_config_mapping(dense, moe):
  cfg = hf_qwen3.config_from_hf(hf_qwen3.read_hf_config(dense[0]))
  assert (cfg.vocab_size, cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
          cfg.head_dim, cfg.d_ff, cfg.rope_theta, cfg.tie_embeddings, cfg.num_experts) == (
              160, 64, 2, 4, 2, 16, 96, 50000.0, True, 0)
  hub_style = dict(hf_qwen3.read_hf_config(dense[0]), rope_parameters=None, rope_theta=1e6)
  assert hf_qwen3.config_from_hf(hub_style).rope_theta == 1e6  # published config.json spelling
  cfg = hf_qwen3.config_from_hf(hf_qwen3.read_hf_config(moe[0]), max_seq_len=16)
  assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_d_ff, tuple(cfg.moe_layers),
          cfg.norm_topk_prob, cfg.num_kv_heads, cfg.max_seq_len) == (8, 2, 32, (0, 2), True, 1,
                                                                     16)


def test_dense_logits_match_transformers(dense):
  d, model = dense
  cfg, params = hf_qwen3.import_hf(str(d), **F32_OVERRIDES)
  tokens = _tokens(cfg.vocab_size)
  with torch.no_grad():
    ref = model(torch.from_numpy(tokens).long()).logits.numpy()
  ours, _ = _composer_forward(cfg, params, tokens)
  diff, scale = _rel_diff(ours, ref)
  assert scale > 0.5  # the logits are not trivially small
  assert diff <= REL_BOUND * scale


def test_moe_logits_and_expert_choices_match_transformers(moe):
  d, model = moe
  cfg, params = hf_qwen3.import_hf(str(d), **F32_OVERRIDES)
  tokens = _tokens(cfg.vocab_size, seed=1)
  with torch.no_grad():
    out = model(torch.from_numpy(tokens).long(), output_router_logits=True)
  ours, ids = _composer_forward(cfg, params, tokens)
  diff, scale = _rel_diff(ours, out.logits.numpy())
  assert scale > 0.5
  assert diff <= REL_BOUND * scale
  router = [r.reshape(tokens.size, -1) for r in out.router_logits]
  assert len(router) == cfg.num_moe_layers == 2
  b, s = tokens.shape
  for layer, r in enumerate(router):
    ref_ids = torch.topk(r, cfg.experts_per_token, dim=-1).indices.numpy().reshape(b, s, -1)
    np.testing.assert_array_equal(ids[:, :, layer], ref_ids)
    assert len({tuple(sorted(x)) for x in ref_ids.reshape(-1, 2)}) > 3  # routing varies


def _cli():
  import importlib.util
  path = os.path.join(os.path.dirname(__file__), "..", "..", "launch", "convert_checkpoint.py")
  spec = importlib.util.spec_from_file_location("convert_checkpoint", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _raw_tensors(hf_dir):
  """name -> (dtype name, shape, raw bytes) read by the safetensors library itself."""
  from safetensors import safe_open
  index = os.path.join(hf_dir, hf_qwen3.INDEX_FILE)
  if os.path.exists(index):
    with open(index) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
  else:
    files = [hf_qwen3.SINGLE_FILE]
  out = {}
  for name in files:
    with safe_open(os.path.join(hf_dir, name), framework="pt") as f:
      for k in f.keys():
        t = f.get_tensor(k)
        raw = t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy().tobytes()
        out[k] = (str(t.dtype), tuple(t.shape), raw)
  return out


@pytest.mark.parametrize("which,dtype", [("dense", torch.float32), ("moe", torch.bfloat16)])
def test_import_export_round_trip_is_bit_exact(which, dtype, dense, moe, tmp_path):
  src = tmp_path / "src"
  if dtype == torch.float32 and which == "dense":
    src = dense[0]
  else:  # re-save the reference model in bf16 (the dtype published checkpoints use)
    cfg_fn = _moe_hf_config if which == "moe" else _dense_hf_config
    cls = (transformers.Qwen3MoeForCausalLM if which == "moe"
           else transformers.Qwen3ForCausalLM)
    _save(cls, cfg_fn(), src, dtype=dtype, seed=2)
  if which == "dense":
    hf_qwen3.convert(str(src), str(tmp_path / "ckpt"))
    hf_qwen3.export_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "out"))
  else:  # through launch/convert_checkpoint.py, into shards from a single-file input
    cli = _cli()
    cli.run(hf_dir=str(src), out=str(tmp_path / "ckpt"), max_seq_len=32)
    cli.run(export_from=str(tmp_path / "ckpt"), out=str(tmp_path / "out"), max_shard_gb=3e-5)
    with pytest.raises(cli.app.UsageError, match="exactly one of"):
      cli.run(hf_dir=str(src), export_from=str(tmp_path / "ckpt"), out=str(tmp_path / "x"))
  a, b = _raw_tensors(str(src)), _raw_tensors(str(tmp_path / "out"))
  assert sorted(a) == sorted(b)
  for k in a:
    assert a[k] == b[k], k
  assert os.path.exists(tmp_path / "out" / hf_qwen3.INDEX_FILE) == (which == "moe")
  with open(src / "generation_config.json") as f, open(tmp_path / "out" /
                                                        "generation_config.json") as g:
    assert f.read() == g.read()


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_exported_checkpoint_loads_in_transformers_with_identical_logits(which, dense, moe,
                                                                        tmp_path):
  """The exported config.json is complete: from the ModelConfig alone (dense, no base
  config) and merged into the source's config.json (MoE)."""
  d, model = dense if which == "dense" else moe
  cfg, params = hf_qwen3.import_hf(str(d))
  base = None if which == "dense" else dict(hf_qwen3.read_hf_config(str(d)))
  hf_qwen3.export_hf(params, cfg, str(tmp_path), base_config=base, dtype="float32")
  cls = model.__class__
  again = cls.from_pretrained(str(tmp_path), attn_implementation="eager",
                              dtype=torch.float32).eval()
  tokens = torch.from_numpy(_tokens(cfg.vocab_size, seed=3)).long()
  with torch.no_grad():
    want, got = model(tokens).logits.numpy(), again(tokens).logits.numpy()
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_training_starts_from_a_converted_checkpoint(dense, tmp_path):
  """convert -> Orbax -> restored straight into the train step's shardings -> TrainState."""
  from composer_rl.model import sharding as shd
  from composer_rl.train import losses
  from composer_rl.train.optimizer import OptimizerConfig
  from composer_rl.train.train_step import TrainConfig, make_train_step
  cfg, params = hf_qwen3.import_hf(str(dense[0]), max_seq_len=32)
  hf_qwen3.convert(str(dense[0]), str(tmp_path), max_seq_len=32)
  assert hf_qwen3.load_model_config(str(tmp_path)) == cfg
  got = hf_qwen3.load_params(str(tmp_path))
  assert jax.tree.structure(got) == jax.tree.structure(hf_qwen3.abstract_params(cfg))
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(y).view(np.uint32), x.view(np.uint32))
  ts = make_train_step(cfg, TrainConfig(optimizer=OptimizerConfig(), loss=losses.LossConfig()),
                       shd.make_mesh({"data": 2}, jax.devices()[:2]))
  state = ts.init_state(0, params=hf_qwen3.load_params(
      str(tmp_path), target=ts.abstract_state().params))
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(y).view(np.uint32), x.view(np.uint32))


def test_fused_expert_layout_imports_to_the_same_params(moe, tmp_path):
  """transformers >= 5 keeps experts fused ([E, 2f, D] gate_up_proj); accept that too."""
  d = moe[0]
  cfg, want = hf_qwen3.import_hf(str(d))
  reader = hf_qwen3.SafetensorsReader(str(d))
  tensors = {n: reader.get(n) for n in reader.names() if ".experts." not in n}
  for i in (0, 2):
    p = f"model.layers.{i}.mlp.experts."
    e = [lambda w, j=j: reader.get(f"{p}{j}.{w}.weight") for j in range(cfg.num_experts)]
    tensors[p + "gate_up_proj"] = np.stack(
        [np.concatenate([f("gate_proj"), f("up_proj")]) for f in e])
    tensors[p + "down_proj"] = np.stack([f("down_proj") for f in e])
  specs = [(n, tensors[n].shape, tensors[n].dtype) for n in sorted(tensors)]
  hf_qwen3.write_safetensors(str(tmp_path / hf_qwen3.SINGLE_FILE), specs, tensors.__getitem__)
  with open(d / "config.json") as f, open(tmp_path / "config.json", "w") as g:
    g.write(f.read())
  _, got = hf_qwen3.import_hf(str(tmp_path))
  for x, y in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(x, y)


def test_clear_errors(dense, moe, tmp_path):
  hf = hf_qwen3.read_hf_config(str(dense[0]))
  with pytest.raises(hf_qwen3.ConversionError, match="unsupported architecture.*llama"):
    hf_qwen3.config_from_hf(dict(hf, model_type="llama"))
  with pytest.raises(hf_qwen3.ConversionError, match="RoPE scaling 'yarn'"):
    hf_qwen3.config_from_hf(dict(hf, rope_scaling={"rope_type": "yarn", "factor": 4.0}))
  reader = hf_qwen3.SafetensorsReader(str(moe[0]))
  tensors = {n: reader.get(n) for n in reader.names()}
  hf_moe = hf_qwen3.read_hf_config(str(moe[0]))

  def write(name, t, config):
    os.makedirs(tmp_path / name)
    specs = [(n, t[n].shape, t[n].dtype) for n in sorted(t)]
    hf_qwen3.write_safetensors(str(tmp_path / name / hf_qwen3.SINGLE_FILE), specs,
                               t.__getitem__)
    with open(tmp_path / name / "config.json", "w") as f:
      json.dump(config, f)
    return str(tmp_path / name)

  gone = "model.layers.2.mlp.experts.5.up_proj.weight"
  missing = write("missing", {k: v for k, v in tensors.items() if k != gone}, hf_moe)
  with pytest.raises(hf_qwen3.ConversionError, match=f"missing 1 tensor.*{gone}"):
    hf_qwen3.import_hf(missing)
  bad = dict(tensors)
  bad["model.layers.0.self_attn.q_proj.weight"] = bad["model.layers.0.self_attn.q_proj.weight"][:8]
  misshapen = write("shape", bad, hf_moe)
  with pytest.raises(hf_qwen3.ConversionError, match=r"q_proj.weight' has shape \[8, 64\], "
                     r"expected \[64, 64\]"):
    hf_qwen3.import_hf(misshapen)
  extra = write("extra", dict(tensors, **{"model.layers.0.self_attn.q_proj.bias":
                                          np.zeros(64, np.float32)}), hf_moe)
  with pytest.raises(hf_qwen3.ConversionError, match="does not explain.*q_proj.bias"):
    hf_qwen3.import_hf(extra)
  dr = hf_qwen3.SafetensorsReader(str(dense[0]))
  dt = {n: dr.get(n) for n in dr.names()}
  emb = dt["model.embed_tokens.weight"]
  hf_qwen3.import_hf(write("tied_copy", dict(dt, **{"lm_head.weight": emb.copy()}), hf))
  with pytest.raises(hf_qwen3.ConversionError, match="lm_head.weight differs"):
    hf_qwen3.import_hf(write("tied_differs", dict(dt, **{"lm_head.weight": emb + 1}), hf))
  path = os.path.join(missing, hf_qwen3.SINGLE_FILE)  # patch a dtype tag to an unknown one
  with open(path, "rb") as f:
    raw = f.read()
  with open(path, "wb") as f:
    f.write(raw.replace(b'"F32"', b'"F8X"', 1))
  with pytest.raises(hf_qwen3.ConversionError, match="unsupported dtype 'F8X'"):
    hf_qwen3.SafetensorsReader(missing)


@pytest.mark.parametrize("which", [pytest.param("dense", marks=pytest.mark.slow), "moe"])
def test_parity_suite_is_clean_on_imported_checkpoints(which, dense, moe):
  """Sampler/trainer bitwise parity holds on imported Qwen3 weights (bf16 compute): decode
  vs full forward and value_and_grad, experts included. Kept to the fewest cases (compiles
  dominate); the sampler-variant cases run on random weights in tests/parity."""
  d = dense[0] if which == "dense" else moe[0]
  cfg, params = hf_qwen3.import_hf(str(d), max_seq_len=32, row_tile=8, attention_key_block=16)
  report = run_suite([cfg], SamplingConfig(top_k=20, max_new_tokens=6, seed=3), params=[params],
                     num_prompts=3, prompt_len_range=(2, 10),
                     batch_sizes=[], prefill_chunks=[5],
                     prompt_buckets=[8], train_batch_sizes=[3], num_devices=[], seed=3)
  assert report["tokens"] > 0
  assert report["mismatched_tokens"] == 0, report
  assert report["routing_mismatches"] == 0, report
  assert report["max_abs_diff"] == 0.0
  runner = ParityRunner(cfg, SamplingConfig(), num_prompts=1, prompt_len_range=(1, 2),
                        batch_sizes=[], prefill_chunks=[], prompt_buckets=[],
                        train_batch_sizes=[], num_devices=[], seed=3, params=params)
  np.testing.assert_array_equal(np.asarray(runner.model.embed[...]), params["embed"])


def test_experiment_starts_from_a_converted_checkpoint_and_exports(dense, tmp_path):
  """experiments/sft_from_hf.py through `trainer.train`: the run starts from the converted
  weights (one step at warm-up's learning rate 0 leaves them bit-identical), writes
  `final_params`, and exporting that gives back the original Hugging Face tensors' bytes.
  An architecture field that contradicts the checkpoint fails at start, naming it."""
  import sys
  from composer_rl.train import config as config_lib
  from composer_rl.train import trainer
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.path.insert(0, os.path.join(root, "experiments"))
  import sft_from_hf  # pylint: disable=g-import-not-at-top
  ckpt = tmp_path / "ckpt"
  hf_qwen3.convert(str(dense[0]), str(ckpt))
  rng = np.random.default_rng(0)
  data = tmp_path / "traj.jsonl"
  with open(data, "w") as f:
    for _ in range(8):
      toks = rng.integers(1, 160, 24).tolist()
      f.write(json.dumps({"tokens": toks, "loss_mask": [0] * 8 + [1] * 16}) + "\n")
  c = sft_from_hf.get_config()
  c.init_checkpoint = str(ckpt)
  c.data.jsonl = str(data)
  c.model.update(max_seq_len=32, row_tile=8, attention_key_block=8)
  c.train.update(steps=1, batch_size=4, seq_len=32, micro_batch_size=2)
  c.optimizer.update(warmup_steps=5, total_steps=10)
  c.checkpoint.update(every_steps=1, async_save=False)
  trainer.train(c, str(tmp_path / "work"))
  final = str(tmp_path / "work" / "final_params")
  want = hf_qwen3.load_params(str(ckpt))
  got = hf_qwen3.load_params(final)
  for x, y in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(y).view(np.uint32), np.asarray(x).view(np.uint32))
  hf_qwen3.export_checkpoint(final, str(tmp_path / "out"))
  a, b = _raw_tensors(str(dense[0])), _raw_tensors(str(tmp_path / "out"))
  assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a)
  c.model.d_model = 96
  with pytest.raises(config_lib.ConfigError, match="config.model.d_model=96 disagrees"):
    config_lib.build(c)
