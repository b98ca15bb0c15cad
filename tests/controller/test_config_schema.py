"""Every kind's config is validated before work starts: unknown fields, wrong types and bad
values are ConfigErrors naming the field; defaults are filled in from the schema."""
import importlib.util
import os
import subprocess
import sys

import ml_collections
import pytest

from composer_rl.config import ConfigError, Field, Free, Section, describe, validate
from composer_rl.controller import config as kinds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (experiment file, variant) of every kind launch/train.py runs.
EXPERIMENTS = [("tiny_bugfix", "default"), ("tiny_bugfix", "smoke"), ("qwen3_bugfix", "default"),
               ("tiny_compaction", "default"), ("tiny_compaction", "ablation_smoke"),
               ("tiny_pipeline", "smoke"), ("online_rl", "smoke"), ("sft_tiny", "default"),
               ("rl_synthetic_tiny", "default"), ("cpt_code", "tiny")]


def _load(name: str, variant: str) -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "experiments",
                                                                   name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config() if variant == "default" else module.get_config(variant)
  config.lock()
  return config


@pytest.mark.parametrize("name,variant", EXPERIMENTS)
def test_every_experiment_validates(name, variant):
  kinds.validate(_load(name, variant))


def _agent(c):
  return c.agent if c.get("kind") in ("pipeline", "compaction_ablation") else c


# A typo and a bad value, for every kind: (experiment, variant, section path, typo field,
# bad field, bad value).
CASES = [
    ("tiny_bugfix", "smoke", "rl", "stesp", "mode", "asynch"),
    ("tiny_compaction", "ablation_smoke", "agent.rl", "stesp", "mode", "asynch"),
    ("tiny_pipeline", "smoke", "agent.rl", "stesp", "rollouts", "cloud"),
    ("online_rl", "smoke", "online", "stesp", "advantage", "ppo"),
    ("sft_tiny", "default", "train", "stesp", "seq_len", 0),
]


def _section(config, path):
  node = config
  for part in path.split("."):
    node = node[part]
  return node


@pytest.mark.parametrize("name,variant,path,typo,field,bad", CASES)
def test_typo_and_bad_value_fail_naming_the_field(name, variant, path, typo, field, bad):
  c = _load(name, variant)
  with c.unlocked():
    _section(c, path)[typo] = 3
  with pytest.raises(ConfigError, match=rf"config\.{path}\.{typo}: unknown field"):
    kinds.validate(c)
  c = _load(name, variant)
  with c.unlocked():
    node = _section(c, path)
    del node[field]
    node[field] = bad
  with pytest.raises(ConfigError, match=rf"config\.{path}\.{field}"):
    kinds.validate(c)


def _replace(node, key, value):
  del node[key]  # a ConfigDict keeps a field's type: drop it to set another
  node[key] = value


# (experiment, variant, how the config is broken, the error it must give)
BROKEN = [
    ("tiny_bugfix", "smoke", lambda c: _replace(c.rl, "slots", 0),
     r"config\.rl\.slots: expected int >= 1, got 0"),
    ("tiny_bugfix", "smoke", lambda c: _replace(c.rl, "learning_rate", "fast"),
     r"config\.rl\.learning_rate: expected float"),
    ("tiny_bugfix", "smoke", lambda c: setattr(c.tasks, "family", "nope"),
     r"config\.tasks\.family: 'nope'; choose one of .*generated"),
    ("tiny_bugfix", "smoke", lambda c: setattr(c.model, "d_modle", 64),
     r"config\.model\.d_modle: unknown field"),
    ("tiny_bugfix", "smoke", lambda c: setattr(c, "trian", ml_collections.ConfigDict()),
     r"config\.trian: unknown field"),
    ("tiny_bugfix", "smoke", lambda c: setattr(c, "kind", "agent_lr"),
     r"config\.kind: 'agent_lr'; choose one of"),
    ("tiny_compaction", "smoke", lambda c: setattr(c.rl.compaction, "mode", "squash"),
     r"config\.rl\.compaction: .*squash"),
    ("tiny_compaction", "ablation_smoke",
     lambda c: setattr(c.arms, "bad", ["compaction", "squash"]), r"config\.arms\.bad"),
    ("online_rl", "smoke", lambda c: setattr(c.serve, "slotz", 3),
     r"config\.serve\.slotz: unknown field"),
    ("tiny_pipeline", "smoke", lambda c: setattr(c.pretrain.train, "stesp", 3),
     r"config\.pretrain\.train\.stesp: unknown field"),
    ("tiny_bugfix", "smoke", lambda c: setattr(c.tasks, "family", "dir"),
     r"config\.tasks\.dir: the 'dir' task source needs the directory"),
    ("tiny_bugfix", "smoke", lambda c: setattr(c.tasks, "dir", "/tmp/tasks"),
     r"config\.tasks\.dir is set but config\.tasks\.family='generated'"),
    ("tiny_bugfix", "smoke", lambda c: setattr(c.model, "remat", "some"),
     r"remat='some'; choose one of"),
]


@pytest.mark.parametrize("name,variant,break_it,match", BROKEN)
def test_errors_name_the_field_and_what_is_allowed(name, variant, break_it, match):
  c = _load(name, variant)
  with c.unlocked():
    break_it(c)
  with pytest.raises(ConfigError, match=match):
    kinds.validate(c)


def test_defaults_are_filled_in_from_the_schema():
  c = _load("tiny_bugfix", "smoke")
  assert "context_mode" not in c.eval and "compaction" not in c.rl
  kinds.validate(c)
  assert c.eval.context_mode == "" and c.eval.full_window_max_seq_len == 0
  assert c.tasks.family == "generated" and c.env.tools == () and c.sft.copy_rows == 0
  assert c.rl.compaction.to_dict() == {} and c.rl.max_staleness == 2


def test_schema_machinery():
  schema = Section(dict(a=Field(1, int, "an int", min=0), b=Field(None, int, optional=True),
                        s=Section(dict(x=Field("p", str, choices=("p", "q")))),
                        args=Free("anything")))
  d = {"a": 3}
  validate(d, schema)
  assert d == {"a": 3, "b": None, "s": {"x": "p"}, "args": {}}
  for bad, msg in [({"a": True}, r"config\.a: expected int, got True"),
                   ({"a": -1}, r"config\.a: expected int >= 0, got -1"),
                   ({"b": "x"}, r"config\.b: expected int or None"),
                   ({"s": {"x": "r"}}, r"config\.s\.x: 'r'; choose one of \['p', 'q'\]"),
                   ({"s": 3}, r"config\.s: expected a section"),
                   ({"args": 3}, r"config\.args: expected a mapping"),
                   ({"c": 1}, r"config\.c: unknown field; known: \['a', 'args', 'b', 's'\]")]:
    with pytest.raises(ConfigError, match=msg):
      validate(bad, schema)
  assert describe(schema)["config.a"] == "1: an int"


@pytest.mark.parametrize("override,message", [
    ("--config.rl.stesp=3", "stesp"),
    ("--config.rl.mode=asynch", "config.rl.mode: 'asynch'; choose one of ['async', 'sync']"),
])
def test_launch_fails_at_once_naming_the_field(tmp_path, override, message):
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "train.py"),
       "--config=" + os.path.join(ROOT, "experiments", "tiny_bugfix.py:smoke"),
       f"--workdir={tmp_path}", override], capture_output=True, text=True, timeout=120,
      env={**os.environ, "PYTHONPATH": ROOT})
  assert proc.returncode != 0
  assert message in proc.stderr
  assert not os.listdir(tmp_path)  # no work started
