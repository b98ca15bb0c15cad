"""Publisher/subscriber: exact bits, small deltas, and every kind of damage detected."""
import glob
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from composer_rl.model import Transformer, get_preset, inference_copy
from composer_rl.sync import codec, store
from composer_rl.sync.publisher import WeightPublisher
from composer_rl.sync.subscriber import WeightSubscriber, materialize


def _bits_equal(a, b):
  fa, fb = codec.flatten(a), codec.flatten(b)
  return fa.keys() == fb.keys() and all(
      np.array_equal(codec.bits_of(fa[k]), codec.bits_of(fb[k])) for k in fa)


@pytest.fixture
def steps():
  """Six successive inference copies of a tiny model: small fp32 updates, as in RL."""
  cfg = get_preset("tiny_moe")
  state = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)))
  out, rng = [], np.random.default_rng(0)
  for _ in range(6):
    out.append(inference_copy(state, cfg))
    state = jax.tree.map(lambda x: x + jnp.asarray(rng.normal(size=x.shape) * 1e-3 * (
        rng.random(x.shape) < 0.05), x.dtype), state)
  return out


def _publish_all(root, steps, **kw):
  pub = WeightPublisher(root, **kw)
  return pub, [pub.publish(s) for s in steps]


def test_subscriber_follows_deltas_exactly(tmp_path, steps):
  root = str(tmp_path / "w")
  pub = WeightPublisher(root, anchor_every=100)
  sub = WeightSubscriber(root, steps[0])
  for i, s in enumerate(steps):
    m = pub.publish(s)
    assert m["kind"] == ("anchor" if i == 0 else "delta")
    assert sub.poll() == i
    assert _bits_equal(sub.params, s)
  assert sub.poll() is None  # nothing new
  assert m["payload_bytes"] * 5 < m["full_bytes"]  # a 5%-sparse update ships far less


def test_anchor_every_and_gc_keep_what_readers_need(tmp_path, steps):
  root = str(tmp_path / "w")
  _, manifests = _publish_all(root, steps, anchor_every=3, keep=2)
  assert [m["kind"] for m in manifests] == ["anchor", "delta", "delta", "anchor", "delta",
                                            "delta"]
  assert store.list_versions(root) == [3, 4, 5]  # 0..2 are behind anchor 3
  assert _bits_equal(materialize(root, 5), codec.flatten(steps[5]))
  fresh = WeightSubscriber(root, steps[0])
  assert fresh.poll() == 5 and _bits_equal(fresh.params, steps[5])


def _damage_data_files(vdir, how):
  """Flips or cuts bytes in every OCDBT data file of a version (Orbax keeps more than one
  copy of some, so damaging a single file may hit one that is never read)."""
  files = [f for f in glob.glob(os.path.join(vdir, "payload", "**"), recursive=True)
           if os.path.isfile(f) and "/d/" in f]
  assert files, vdir
  for path in files:
    data = open(path, "rb").read()
    with open(path, "wb") as f:
      f.write(data[: len(data) // 2] if how == "truncate" else
              data[:-8] + bytes(b ^ 0xFF for b in data[-8:]))


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "missing", "reordered",
                                    "bad_manifest"])
def test_damaged_versions_are_detected_and_never_applied(tmp_path, steps, damage):
  root = str(tmp_path / "w")
  pub = WeightPublisher(root, anchor_every=100)
  sub = WeightSubscriber(root, steps[0])
  for s in steps[:2]:
    pub.publish(s)
  assert sub.poll() == 1
  for s in steps[2:5]:
    pub.publish(s)  # versions 2, 3, 4
  v2, v3 = store.version_dir(root, 2), store.version_dir(root, 3)
  if damage in ("corrupt", "truncate"):
    _damage_data_files(v2, damage)
  elif damage == "missing":
    shutil.rmtree(v2)
  elif damage == "reordered":
    os.rename(v2, v2 + ".x")
    os.rename(v3, v2)
    os.rename(v2 + ".x", v3)
  else:
    with open(os.path.join(v2, "manifest.json"), "w") as f:
      f.write("{not json")
  sub.poll()
  # Version 2 cannot be verified, so nothing past version 1 may be applied.
  assert sub.version == 1 and _bits_equal(sub.params, steps[1])
  assert any("version 2" in line or "version 3" in line for line in sub.log), sub.log
  # A new anchor heals the subscriber.
  pub2 = WeightPublisher(root, anchor_every=1)
  pub2.publish(steps[5])
  assert sub.poll() == 5 and _bits_equal(sub.params, steps[5])


def test_partial_write_is_invisible(tmp_path, steps):
  root = str(tmp_path / "w")
  pub = WeightPublisher(root)
  pub.publish(steps[0])
  os.makedirs(os.path.join(root, ".tmp-00000001-dead"))  # a publisher killed mid-write
  sub = WeightSubscriber(root, steps[0])
  assert sub.poll() == 0 and store.list_versions(root) == [0]


def test_publisher_resumes_from_disk(tmp_path, steps):
  root = str(tmp_path / "w")
  WeightPublisher(root, anchor_every=100).publish(steps[0])
  pub = WeightPublisher(root, anchor_every=100)  # a restarted trainer
  m = pub.publish(steps[1])
  assert m["version"] == 1 and m["kind"] == "delta"
  assert _bits_equal(materialize(root, 1), codec.flatten(steps[1]))


def test_fingerprint_device_matches_numpy():
  x = np.random.default_rng(0).integers(0, 2**16, 10001, dtype=np.uint16)
  assert list(codec.fingerprint_np(x)) == np.asarray(codec.fingerprint_device(jnp.asarray(x))).tolist()
  y = x.copy()
  y[[3, 4]] = y[[4, 3]]
  assert codec.fingerprint_np(y) != codec.fingerprint_np(x) or x[3] == x[4]


def test_fingerprint_update_equals_full_recompute():
  rng = np.random.default_rng(1)
  x = rng.integers(0, 2**16, 5000).astype(np.uint16)
  y = x.copy()
  pos = np.sort(rng.choice(x.size, 60, replace=False))
  y[pos] ^= rng.integers(1, 2**16, 60).astype(np.uint16)
  assert codec.fingerprint_update(codec.fingerprint_np(x), pos, x[pos], y[pos]) == \
      codec.fingerprint_np(y)
  # and on device, from the XORs alone, in place
  got, d = codec.apply_changes(jnp.asarray(x), jnp.asarray(np.append(pos, x.size), jnp.int32),
                               jnp.asarray(np.append(x[pos] ^ y[pos], 7).astype(np.uint16)))
  assert np.array_equal(np.asarray(got), y)  # the padding position (== size) is dropped
  f = codec.fingerprint_np(x)
  assert [(f[0] + int(np.asarray(d)[0])) % 2**32, (f[1] + int(np.asarray(d)[1])) % 2**32] \
      == list(codec.fingerprint_np(y))


def test_failed_leaf_rolls_back_a_half_applied_delta(tmp_path, steps):
  """A delta whose payload is intact but whose result does not verify (here: the recorded
  fingerprint of its last changed leaf is wrong) leaves the subscriber bit-exactly at the
  previous version, although earlier leaves were already changed in place."""
  root = str(tmp_path / "w")
  pub = WeightPublisher(root, anchor_every=100)
  sub = WeightSubscriber(root, steps[0])
  pub.publish(steps[0])
  assert sub.poll() == 0
  m = pub.publish(steps[1])
  changed = [k for k, v in m["leaves"].items() if v["nnz"]]
  assert len(changed) > 2
  path = os.path.join(store.version_dir(root, 1), "manifest.json")
  bad = store.read_manifest(root, 1)
  bad["leaves"][changed[-1]]["fingerprint"][0] ^= 1
  with open(path, "w") as f:
    json.dump(bad, f)
  assert sub.poll() is None  # nothing newer verifies; no anchor after 0
  assert sub.version == 0 and _bits_equal(sub.params, steps[0])
  assert any("fails its fingerprint" in line for line in sub.log)


def test_delta_payload_is_a_few_packed_arrays(tmp_path, steps):
  """However many leaves change, a delta is written as <= 4 arrays (16- and 32-bit gaps, 2-
  and 4-byte XORs), and gaps restart per leaf so they stay 16-bit."""
  root = str(tmp_path / "w")
  pub = WeightPublisher(root, anchor_every=100)
  pub.publish(steps[0])
  m = pub.publish(steps[1])
  assert sum(1 for v in m["leaves"].values() if v["nnz"]) > 3
  payload = store._checkpointer().restore(os.path.join(store.version_dir(root, 1), "payload"))
  assert set(payload) <= {"gaps2", "xor2", "xor4"} and payload["gaps2"].dtype == np.uint16
  assert len(payload["gaps2"]) == m["changed"]


def test_payload_shorter_than_its_manifest_is_never_applied(tmp_path, steps):
  root = str(tmp_path / "w")
  pub = WeightPublisher(root, anchor_every=100)
  sub = WeightSubscriber(root, steps[0])
  pub.publish(steps[0])
  assert sub.poll() == 0
  pub.publish(steps[1])
  path = os.path.join(store.version_dir(root, 1), "payload")
  payload = store._checkpointer().restore(path)
  shutil.rmtree(path)
  store._checkpointer().save(path, {k: np.asarray(v)[:-1] for k, v in payload.items()})
  assert sub.poll() is None
  assert sub.version == 0 and _bits_equal(sub.params, steps[0])
  assert any("truncated" in line for line in sub.log), sub.log


def test_delta_larger_than_the_scatter_capacity_applies_in_chunks(tmp_path):
  """A leaf whose delta exceeds its fixed scatter capacity is applied in several chunks of
  that capacity, exactly (and its fingerprint still verifies)."""
  rng = np.random.default_rng(0)
  a = {"w": jnp.asarray(rng.normal(size=(64, 1024)), jnp.bfloat16)}
  cap = codec.leaf_capacity(a["w"].size)
  assert cap < a["w"].size // 4
  bumped = (a["w"].astype(jnp.float32) * 1.5 + 0.25).astype(jnp.bfloat16)
  b = {"w": jnp.where(jnp.asarray(rng.random(a["w"].shape) < 0.3), bumped, a["w"])}
  root = str(tmp_path / "w")
  pub = WeightPublisher(root, anchor_every=100)
  sub = WeightSubscriber(root, a)
  pub.publish(a)
  assert sub.poll() == 0
  m = pub.publish(b)
  assert m["kind"] == "delta" and m["changed"] > 2 * cap
  assert sub.poll() == 1 and _bits_equal(sub.params, b)
