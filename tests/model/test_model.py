"""Model correctness against plain reference implementations (values, not bits)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from composer_rl.model import KVCache, ModelConfig, Transformer, get_preset, load_balancing_loss
from composer_rl.ops import exact, grouped
from composer_rl.sampling.head import RowSampling
from composer_rl.train.scoring import score_tokens


def _ref_attention(q, k, v, causal_len):
  """Naive causal GQA attention over the first causal_len keys. q [S,H,D], k/v [L,G,D]."""
  s, h, d = q.shape
  g = k.shape[1]
  k = np.repeat(k, h // g, axis=1)
  v = np.repeat(v, h // g, axis=1)
  out = np.zeros((s, h, d), np.float64)
  for i in range(s):
    sc = np.einsum("hd,lhd->hl", q[i], k[:causal_len[i] + 1])
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out[i] = np.einsum("hl,lhd->hd", p, v[:causal_len[i] + 1])
  return out


def test_attention_matches_reference():
  rng = np.random.default_rng(0)
  b, s, h, g, d, length = 2, 5, 4, 2, 8, 16
  q = rng.normal(size=(b, s, h, d)).astype(np.float32)
  k = rng.normal(size=(b, g, length, d)).astype(np.float32)
  v = rng.normal(size=(b, g, length, d)).astype(np.float32)
  slots = np.array([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]], np.int32)  # 2nd sequence has history
  segs = np.zeros((b, length), np.int32)
  segs[0, :5] = 1
  segs[1, :8] = 1
  out = np.asarray(exact.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                   jnp.asarray(segs), jnp.asarray(slots),
                                   jnp.ones((b, s), jnp.int32), key_block=8))
  for i in range(b):
    ref = _ref_attention(q[i], k[i].transpose(1, 0, 2), v[i].transpose(1, 0, 2), slots[i])
    np.testing.assert_allclose(out[i], ref, rtol=1e-5, atol=1e-5)


def test_attention_respects_segments():
  """A query never sees a key of another segment (packed documents)."""
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.normal(size=(1, 4, 2, 4)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 1, 8, 4)), jnp.float32)
  v = rng.normal(size=(1, 1, 8, 4)).astype(np.float32)
  segs = np.array([[1, 1, 2, 2, 0, 0, 0, 0]], np.int32)
  out = exact.attention(q, k, jnp.asarray(v), jnp.asarray(segs), jnp.arange(4)[None],
                        jnp.asarray(segs[:, :4]), key_block=8)
  # Query 2 is the first token of segment 2: it attends only to itself.
  np.testing.assert_allclose(np.asarray(out[0, 2, 0]), v[0, 0, 2], rtol=1e-6)


def test_grouped_moe_matches_per_token_reference():
  rng = np.random.default_rng(2)
  n, d, f, e, k = 37, 16, 24, 5, 2
  x = rng.normal(size=(n, d)).astype(np.float32)
  ids = np.stack([rng.choice(e, size=k, replace=False) for _ in range(n)]).astype(np.int32)
  gates = rng.random((n, k)).astype(np.float32)
  wg, wu = rng.normal(size=(e, d, f)).astype(np.float32), rng.normal(size=(e, d, f)).astype(np.float32)
  wd = rng.normal(size=(e, f, d)).astype(np.float32)
  out = np.asarray(grouped.grouped_swiglu(jnp.asarray(x), jnp.asarray(ids), jnp.asarray(gates),
                                          jnp.asarray(wg), jnp.asarray(wu), jnp.asarray(wd),
                                          tile=4, dtype=jnp.float32))
  silu = lambda a: a / (1 + np.exp(-a))
  ref = np.zeros((n, d))
  for t in range(n):
    for j in range(k):
      ex = ids[t, j]
      ref[t] += gates[t, j] * ((silu(x[t] @ wg[ex]) * (x[t] @ wu[ex])) @ wd[ex])
  np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4)


def test_moe_tile_follows_the_routed_rows():
  # the power of two at or above the mean rows per expert, within [dense's fewest rows,
  # the model's row_tile]: decode of 16 tokens x 8 experts over 128 takes 2-row tiles, a
  # 1,024-token training row the full 128; past 2,048 columns dense needs 8 rows.
  assert grouped.tile_rows(16 * 8, 128, 128, 2048) == 2
  assert grouped.tile_rows(1 * 8, 128, 128, 2048) == 2
  assert grouped.tile_rows(64 * 8, 128, 128, 2048) == 4
  assert grouped.tile_rows(100 * 8, 128, 128, 2048) == 8
  assert grouped.tile_rows(1024 * 8, 128, 128, 2048) == 64
  assert grouped.tile_rows(8192 * 8, 128, 128, 2048) == 128
  assert grouped.tile_rows(1 * 8, 128, 128, 4096) == 8
  assert grouped.tile_rows(37 * 2, 5, 4, 24) == 4


def test_moe_bits_do_not_depend_on_tile_batch_or_live_tiles():
  """Any tile, the sampler's live tiles or the trainer's static buffer, a token alone or
  in a batch: the same bits (exact.dense is row-invariant, so the tile is free)."""
  rng = np.random.default_rng(3)
  for n, d, f, e, k, dtype in ((37, 64, 48, 8, 2, jnp.float32), (9, 32, 2304, 16, 4, jnp.float32),
                               (50, 64, 32, 4, 2, jnp.bfloat16)):
    x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    ids = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(n)]), jnp.int32)
    gates = jnp.asarray(rng.random((n, k)), jnp.float32)
    w = [jnp.asarray(rng.normal(size=s) * 0.1, jnp.float32) for s in ((e, d, f), (e, d, f),
                                                                      (e, f, d))]
    run = lambda rows, tile, live: np.asarray(jax.jit(
        lambda *a: grouped.grouped_swiglu(*a, tile=tile, dtype=dtype, live_only=live))(
            x[rows], ids[rows], gates[rows], *w)).view(np.uint32)
    want = run(slice(None), 128, False)
    for tile in (2, 8, 32):
      for live in (False, True):
        np.testing.assert_array_equal(run(slice(None), tile, live), want)
    for i in (0, n - 1):
      np.testing.assert_array_equal(run(slice(i, i + 1), 128, True), want[i:i + 1])
    np.testing.assert_array_equal(run(slice(1, 7), 16, True), want[1:7])


def test_map_row_tiles_is_the_plain_function_for_any_row_count():
  fn = lambda a: (jnp.tanh(a[0]) * a[1][:, None], a[1] + 1)
  for rows in (1, 7, 16, 33):
    x = jnp.arange(rows * 3, dtype=jnp.float32).reshape(rows, 3) / 10
    y = jnp.arange(rows, dtype=jnp.float32)
    got = exact.map_row_tiles(fn, (x, y), 8)
    want = fn((x, y))
    for a, b in zip(got, want):
      assert a.shape == b.shape
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_forward_shapes_and_cache_writes():
  cfg = get_preset("tiny_moe")
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  cache = KVCache.init(cfg, 3)
  tokens = jnp.ones((3, 5), jnp.int32)
  out = model.forward(tokens, jnp.broadcast_to(jnp.arange(5), (3, 5)), cache,
                      jnp.array([0, 2, 4]), None)
  assert out.hidden.shape == (3, 5, cfg.d_model)
  assert out.expert_ids.shape == (3, 5, cfg.num_moe_layers, cfg.experts_per_token)
  segs = np.asarray(out.cache.segments)
  assert segs[0, :5].tolist() == [1] * 5 and segs[0, 5:].sum() == 0
  assert segs[1, :2].sum() == 0 and segs[1, 2:7].tolist() == [1] * 5
  written = np.abs(np.asarray(out.cache.v[:, 0])[2]).sum(-1)  # [kv_heads, slots]
  assert (written[:, 4:9] > 0).all() and (written[:, :4] == 0).all()


def test_load_balancing_loss_hand_computed():
  # 2 tokens, 1 MoE layer, 2 experts, top-1: token0 -> e0 (p=[.8,.2]), token1 -> e0 ([.6,.4])
  ids = jnp.array([[[[0]], [[0]]]])
  probs = jnp.array([[[[0.8, 0.2]], [[0.6, 0.4]]]])
  loss = load_balancing_loss(ids, probs, jnp.ones((1, 2)))
  # f = [1, 0], P = [0.7, 0.3] -> E * sum f*P = 2 * 0.7
  np.testing.assert_allclose(float(loss), 1.4, rtol=1e-6)
  # Masked token is ignored: only token1 -> f=[1,0], P=[.6,.4] -> 1.2
  np.testing.assert_allclose(float(load_balancing_loss(ids, probs, jnp.array([[0, 1]]))), 1.2,
                             rtol=1e-6)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(num_heads=6, num_kv_heads=4), "num_kv_heads"),
    (dict(head_dim=7), "head_dim"),
    (dict(compute_dtype="float16"), "compute_dtype"),
    (dict(num_experts=4, experts_per_token=5), "experts_per_token"),
    (dict(num_experts=4, moe_layers=(9,)), "moe_layers"),
    (dict(moe_layers=(0,)), "num_experts is 0"),
    (dict(d_model=0), "d_model"),
])
def test_bad_model_config_names_the_field(kwargs, needle):
  with pytest.raises(ValueError, match=needle):
    ModelConfig(**kwargs)


def test_presets_have_qwen3_shapes_without_instantiating():
  q = get_preset("qwen3_30b_a3b")
  assert (q.num_experts, q.experts_per_token, q.num_moe_layers) == (128, 8, 48)
  abstract = nnx.eval_shape(lambda: Transformer(get_preset("qwen3_0_6b"), rngs=nnx.Rngs(0)))
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract)))
  assert 0.55e9 < n < 0.65e9, n  # Qwen3-0.6B has ~0.6B parameters (tied embeddings)
  with pytest.raises(ValueError, match="unknown model preset"):
    get_preset("qwen9")


def test_ids_past_the_tokenizer_are_never_sampled():
  """`token_count`: a vocabulary padded past the tokenizer (Qwen3's) gives those ids -inf
  logits, so sampling at any temperature never draws them and the rest still sum to 1."""
  from composer_rl.sampling import head as head_lib  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match=r"token_count=20 must be in \[0, vocab_size=16\]"):
    ModelConfig(vocab_size=16, token_count=20)
  cfg = ModelConfig(vocab_size=16, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                    head_dim=16, d_ff=32, max_seq_len=16, compute_dtype="float32",
                    token_count=10)
  m = Transformer(cfg, rngs=nnx.Rngs(0))
  hidden = jax.random.normal(jax.random.key(1), (64, cfg.d_model)) * 4.0
  logits = np.asarray(m.logits(hidden))
  assert np.all(np.isneginf(logits[:, 10:])) and np.all(np.isfinite(logits[:, :10]))
  rows = head_lib.RowSampling.broadcast(64, 3.0, 0, 1.0)
  keys = head_lib.token_keys(0, jnp.arange(64), jnp.zeros(64, jnp.int32))
  out = head_lib.token_head(m.logits, hidden, keys, jnp.full((64,), -1), rows)
  assert int(np.max(out.tokens)) < 10 and np.all(np.isfinite(out.logprobs))
  lp = np.asarray(head_lib.transformed_logprobs(jnp.asarray(logits), rows))
  np.testing.assert_allclose(np.exp(lp[:, :10]).sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("preset", [pytest.param("tiny", marks=pytest.mark.slow), "tiny_moe"])
def test_remat_policies_give_the_same_bits(preset):
  """`ModelConfig.remat` changes what the backward keeps, never a value: log-probs and
  gradients are the same uint32 bits under 'none', 'dots' and 'full'."""
  toks = np.random.default_rng(0).integers(1, 200, (2, 40)).astype(np.int32)
  rows = RowSampling.broadcast(2)
  got = {}
  for remat in ("none", "dots", "full"):
    g, p = nnx.split(Transformer(get_preset(preset, max_seq_len=64, remat=remat),
                                 rngs=nnx.Rngs(0)))

    def loss(p, g=g):
      lp = score_tokens(nnx.merge(g, p), toks, rows).logprobs
      return jnp.sum(lp), lp
    (_, lp), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(p)
    got[remat] = [np.asarray(x).view(np.uint32) for x in [lp] + jax.tree.leaves(grads)]
  for remat in ("dots", "full"):
    for a, b in zip(got[remat], got["none"]):
      np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="remat='some'"):
    get_preset(preset, remat="some")


def _dots(cfg: ModelConfig) -> int:
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  toks = jnp.ones((2, 8), jnp.int32)
  fwd = jax.jit(lambda m: m.forward(toks, jnp.broadcast_to(jnp.arange(8), (2, 8)),
                                    KVCache.init(cfg, 2), jnp.zeros((2,), jnp.int32)).hidden)
  return fwd.lower(model).as_text().count("stablehlo.dot_general")


def test_layers_are_one_compiled_body():
  """The forward scans one block body over the stacked layers: the program does not grow
  with depth (28 layers of Qwen3-0.6B compile as one)."""
  assert _dots(get_preset("tiny", num_layers=8)) == _dots(get_preset("tiny", num_layers=2))


@pytest.mark.parametrize("moe_layers", [None, (1,), (1, 2)])
def test_cache_in_the_carry_or_streamed_gives_the_same_bits(moe_layers):
  """`for_grad` changes how the cache travels through the layer loop, and `layer_unroll`
  how many layers one loop iteration runs, never a value: hidden states, written caches
  and routing are the same bits, for runs of dense and MoE layers in any order."""
  cfg = (get_preset("tiny", num_layers=4) if moe_layers is None else
         get_preset("tiny_moe", num_layers=4, moe_layers=moe_layers))
  toks = jnp.asarray(np.random.default_rng(0).integers(1, 200, (2, 9)), jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(9), (2, 9))
  cache = KVCache.init(cfg, 2)
  outs = [jax.jit(lambda m, g=g: m.forward(toks, pos, cache, jnp.array([0, 3]),
                                           for_grad=g))(
                                               Transformer(cfg.replace(layer_unroll=u),
                                                           rngs=nnx.Rngs(1)))
          for g, u in ((False, 1), (True, 1), (False, 4), (True, 2))]
  for other in outs[1:]:
    for a, b in zip(*(jax.tree.leaves(o) for o in (outs[0], other))):
      a, b = np.asarray(a), np.asarray(b)
      if a.dtype.itemsize == 4:
        a, b = a.view(np.uint32), b.view(np.uint32)
      else:
        a, b = a.view(np.uint16), b.view(np.uint16)
      np.testing.assert_array_equal(a, b)
  assert outs[0].expert_ids.shape[2] == cfg.num_moe_layers
