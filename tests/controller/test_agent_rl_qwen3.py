"""Agent RL in Qwen3's chat format (`config.chat.format='qwen3'`), run the way
docs/qwen3_guide.md tells a user to: a Qwen3-architecture model made by `transformers` with a
byte-level BPE tokenizer trained here (nothing downloaded) is converted, tasks are made from
a small repository, and demonstrations, SFT, rollouts, RL and evaluation run with its ids,
`<|im_start|>` turns and `<tool_call>` calls that the harness parses; the export loads in
`transformers`. Bad chat settings fail naming the field."""
import glob
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tokenizers")

from composer_rl.controller import agent_setup, agent_sft  # noqa: E402
from composer_rl.data.hf_tokenizer import HfTokenizer  # noqa: E402
from tests import qwen3_artifacts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import tiny_bugfix  # noqa: E402


@pytest.fixture
def tokenizer_dir(qwen3_tokenizer):
  return qwen3_tokenizer


@pytest.fixture
def checkpoint(qwen3_checkpoint):
  return qwen3_checkpoint


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


GUIDE = os.path.join(ROOT, "docs", "qwen3_guide.md")

# A user's repository: a package whose own tests pass. Six functions: the tasks' held-out
# split is the fifth by name (`mean`). Task ids hash the files; with these, three of the
# five train tasks are among the weak demonstrator's fixes (a `fix_prob` share of ids).
MYLIB = {
    "mylib/__init__.py": (
        '"""mylib 0."""\n\n\n'
        "def add(a, b):\n    return a + b\n\n\n"
        "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n"
        "        return hi\n    return x\n\n\n"
        "def is_even(n):\n    return n % 2 == 0\n\n\n"
        "def last(items):\n    if not items:\n        return None\n    return items[-1]\n\n\n"
        "def mean(xs):\n    return sum(xs) / len(xs)\n\n\n"
        "def smaller(a, b):\n    if a < b:\n        return a\n    return b\n"),
    "tests/test_mylib.py": (
        "from mylib import add, clamp, is_even, last, mean, smaller\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5 and add(-1, 1) == 0\n\n\n"
        "def test_clamp():\n    assert clamp(5, 0, 3) == 3 and clamp(-2, 0, 3) == 0 "
        "and clamp(2, 0, 3) == 2\n\n\n"
        "def test_is_even():\n    assert is_even(4) and not is_even(3)\n\n\n"
        "def test_last():\n    assert last([1, 2, 3]) == 3 and last([]) is None\n\n\n"
        "def test_mean():\n    assert mean([1, 2, 3, 6]) == 3\n\n\n"
        "def test_smaller():\n    assert smaller(1, 2) == 1 and smaller(5, 4) == 4\n"),
}


def guide_commands():
  """The guide's bash blocks in order, without the one that sets the user's paths."""
  with open(GUIDE) as f:
    text = f.read()
  blocks = [b.split("```", 1)[0].strip() for b in text.split("```bash\n")[1:]]
  assert blocks[0].startswith("# set these")
  return blocks[1:]


def test_the_guide_runs_a_converted_checkpoint_on_your_repositorys_tasks(
    tmp_path, tokenizer_dir, qwen3_hf_dir):
  """docs/qwen3_guide.md, command by command: a Hugging Face Qwen3 checkpoint converted,
  tasks made from a repository, SFT + async GRPO in Qwen3's format on them, the viewer,
  the export loaded by `transformers`. Then what each step wrote is checked."""
  repo, work = tmp_path / "mylib", tmp_path / "work"
  for path, text in MYLIB.items():
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
  env = dict(os.environ, HF_DIR=qwen3_hf_dir, REPO=str(repo), WORK=str(work), SIZE=":smoke",
             TEST_CMD="python -m pytest -q tests")
  outputs = []
  for cmd in guide_commands():
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{cmd}\n{done.stderr[-3000:]}"
    outputs.append(done.stdout)
  convert, make_tasks, train, view, export = outputs
  assert json.loads(make_tasks.strip().splitlines()[-1])["kept"] >= 6
  summary = json.loads(train.strip().splitlines()[-1])
  assert 0.0 <= summary["heldout_solve_rate_rl"] <= 1.0
  assert "Qwen3ForCausalLM" in export
  wd = work / "run"
  # The run trained and evaluated on the directory's split: held-out tasks break a
  # function no train task breaks.
  from composer_rl.env.tasks import realrepo  # pylint: disable=import-outside-toplevel
  split = realrepo.load_task_dir(str(work / "tasks"))
  held = {t.meta["function"] for t in split["heldout"]}
  assert held == {"mean"} and not held & {t.meta["function"] for t in split["train"]}
  tok = HfTokenizer(tokenizer_dir)
  im_start, im_end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
  (demo_file,) = glob.glob(str(wd / "demos_*.jsonl"))
  demos = _rows(demo_file)
  # The demonstrator wrote Qwen3 calls on the repository's tasks, the harness parsed every
  # one, and the fixing demonstrations earned their reward in the sandbox.
  assert all(d["task_id"] in {t.id for t in split["train"]} for d in demos)
  assert all(text.startswith("<tool_call>\n") for d in demos for text in d["turn_texts"])
  assert all(d["metrics"]["malformed_calls"] == 0 for d in demos)
  assert any(d["reward"] == 1.0 for d in demos)
  for d in demos:
    assert d["tokens"][0] == im_start and d["tokens"].count(im_end) >= 3
    # every model turn ends on <|im_end|>, the token the trainer learns to stop with
    ends = [t for t, m in zip(d["tokens"], d["loss_mask"]) if m]
    assert ends.count(im_end) == d["turns"]
  rl = sorted(p for p in os.listdir(wd / "rollouts") if p.startswith("rl_step_"))
  sessions = [t for p in rl for t in _rows(wd / "rollouts" / p)]
  assert sessions and all(t["tokens"][0] == im_start for t in sessions)
  assert all(max(t["tokens"]) < tok.vocab_size for t in sessions)
  assert all(t["logprobs_are_uint32_bits"] and sum(t["loss_mask"]) > 0 for t in sessions)
  _export_is_the_trained_policy_and_generates(wd, work / "export", qwen3_hf_dir)
  # The viewer read the run's Qwen3 calls and token names (its chat.json).
  (demo_shard,) = glob.glob(str(wd / "viewer" / "data" / "shards" / "demos_*.0.json"))
  with open(demo_shard) as f:
    demo_views = json.load(f)
  for v in demo_views:
    assert v["tokens"]["names"][str(im_end)] == "<|im_end|>"
    assert all(t["call"] is not None and t["error"] is None for t in v["turns_detail"])


def _export_is_the_trained_policy_and_generates(wd, out, hf_dir):
  """The exported tensors are the run's trained ones (final_params/, not the checkpoint
  the run started from), and `transformers` generates with them."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  import numpy as np  # pylint: disable=import-outside-toplevel
  from composer_rl.model import hf_qwen3  # pylint: disable=import-outside-toplevel
  assert os.path.exists(out / "tokenizer.json")
  model = transformers.Qwen3ForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32)
  start = transformers.Qwen3ForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
  tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
  trained = hf_qwen3.load_params(str(wd / "final_params"))
  got = model.model.layers[0].mlp.down_proj.weight.detach().numpy()
  want = np.asarray(trained["layers"]["mlp"]["w_down"][0]).T
  assert np.array_equal(got, want.astype(got.dtype))
  assert not np.array_equal(got, start.model.layers[0].mlp.down_proj.weight.detach().numpy())
  ids = torch.tensor([tok.encode("def add(a, b):")])
  gen = model.generate(ids, max_new_tokens=8, do_sample=False,
                       pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
  assert gen.shape[1] > ids.shape[1]


def _config(**chat):
  c = tiny_bugfix.get_config("smoke")
  c.chat.update(chat)
  return c


def test_bad_chat_settings_are_named(tmp_path, tokenizer_dir):
  with pytest.raises(ValueError, match=r"config\.chat\.tokenizer"):
    agent_setup.Setup(_config(format="qwen3"), str(tmp_path))
  with pytest.raises(FileNotFoundError, match="no tokenizer.json in"):
    agent_setup.Setup(_config(format="qwen3", tokenizer=str(tmp_path)), str(tmp_path))
  # A demonstration longer than the window (Qwen3's tools block alone is ~750 tokens of
  # this tokenizer) is named with what to change, before any training.
  c = _config(format="qwen3", tokenizer=tokenizer_dir)
  c.model.max_seq_len = 512
  with pytest.raises(ValueError, match=r"longer than model\.max_seq_len=512"):
    agent_sft.sft_stage(agent_setup.Setup(c, str(tmp_path / "short")))
  s = agent_setup.Setup(_config(format="qwen3", tokenizer=tokenizer_dir), str(tmp_path))
  assert s.model_config.vocab_size == HfTokenizer(tokenizer_dir).vocab_size
  assert s.env_config.call_syntax == "qwen3"


def test_checkpoint_settings_are_checked(tmp_path, tokenizer_dir, checkpoint):
  c = _config(format="qwen3")
  c.init_checkpoint = checkpoint
  c.model.max_seq_len = 256  # a runtime field: taken; the architecture is the checkpoint's
  s = agent_setup.Setup(c, str(tmp_path / "ok"))
  assert (s.model_config.vocab_size, s.model_config.d_model, s.model_config.max_seq_len) == (
      1024, 32, 256)
  c.init_checkpoint = str(tmp_path)
  with pytest.raises(FileNotFoundError, match="no model_config.json"):
    agent_setup.Setup(c, str(tmp_path / "missing"))
  # A model whose vocabulary is smaller than the tokenizer's does not belong with it.
  small = qwen3_artifacts.make_checkpoint(tokenizer_dir, str(tmp_path / "hf_small"),
                                          str(tmp_path / "ckpt_small"), 512)
  c.init_checkpoint = small
  with pytest.raises(ValueError, match=r"has a vocabulary of 512: they do not belong"):
    agent_setup.Setup(c, str(tmp_path / "mismatch"))
