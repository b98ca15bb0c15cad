"""Grain pipelines: seeded shuffle, repeat, grouping, filtering, exact state restore."""
from composer_rl.train import data


def _ids(batches):
  return [[(g.group_id, g.task) for g in b] for b in batches]


def test_task_groups_shuffle_repeat_group_filter():
  ds = data.task_groups(list(range(10)), group_size=4, groups_per_step=3, seed=7,
                        keep=lambda t: t % 5 != 0)
  it = data.iterator(ds)
  batches = [next(it) for _ in range(8)]  # 24 visits = 3 epochs of the 8 kept tasks
  tasks = [g.task for b in batches for g in b]
  assert 0 not in tasks and 5 not in tasks
  for epoch in range(3):
    assert sorted(tasks[8 * epoch:8 * (epoch + 1)]) == [1, 2, 3, 4, 6, 7, 8, 9]
  assert tasks[:8] != tasks[8:16]  # reshuffled every epoch
  ids = [g.group_id for b in batches for g in b]
  assert len(set(ids)) == len(ids)
  assert batches[0][0].seq_ids() == [batches[0][0].group_id * 4 + j for j in range(4)]
  again = data.iterator(data.task_groups(list(range(10)), 4, 3, seed=7,
                                         keep=lambda t: t % 5 != 0))
  assert _ids([next(again) for _ in range(8)]) == _ids(batches)  # seeded


def test_iterator_state_restores_exactly():
  make = lambda: data.task_groups(list(range(13)), group_size=2, groups_per_step=2, seed=3)
  it = data.iterator(make())
  for _ in range(5):
    next(it)
  state = it.get_state()
  expected = _ids([next(it) for _ in range(10)])
  resumed = data.iterator(make(), state)
  assert _ids([next(resumed) for _ in range(10)]) == expected


def test_sft_batches_filter_and_restore(tmp_path):
  recs = [dict(tokens=list(range(n)), loss_mask=[0] * (n // 2) + [1] * (n - n // 2))
          for n in range(2, 30)]
  path = str(tmp_path / "t.jsonl")
  data.write_jsonl(path, recs)
  assert data.read_jsonl(path) == recs
  ds = data.sft_batches(recs, batch_size=4, max_len=20, seed=0)
  it = data.iterator(ds)
  first = [next(it) for _ in range(3)]
  assert all(len(r["tokens"]) <= 20 for b in first for r in b)
  state = it.get_state()
  want = [next(it) for _ in range(4)]
  got = data.iterator(ds, state)
  assert [next(got) for _ in range(4)] == want
