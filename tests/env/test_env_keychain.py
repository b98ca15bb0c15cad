"""The keychain family (the compaction experiment's long tasks) and its demonstrator
(`key_collector`): graded by the real tamper-proof grader in the sandbox; the answer cannot
import the parts; a session that solves a task does not fit the experiment's window; the
demonstrator's summaries carry the parts it read, so a part read in the first context
reaches the key only through them."""
import dataclasses
import os
import sys

import pytest

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env import run_episode
from composer_rl.env.harness import EnvConfig, make_env
from composer_rl.env.policies import ScriptedPolicy, make_policy
from composer_rl.env.tasks import TASK_SOURCES, Task, get_task, keychain
from composer_rl.rollout import compaction as cl
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.scripted import scripted_trajectory

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "experiments"))
import tiny_compaction  # noqa: E402

CFG = tiny_compaction.agent_config()
WINDOW = CFG.model.max_seq_len
COMP = cl.CompactionConfig(**dict(CFG.rl.compaction))
ENV = EnvConfig(call_syntax="tool_compact", max_turns=CFG.env.max_turns,
                system_prompt=CFG.env.system_prompt, tools=tuple(CFG.env.tools))
CHAT = ChatFormat(ByteTokenizer())
ALL_TOOLS = dataclasses.replace(ENV, tools=())


class Answer(ScriptedPolicy):
    """Writes `content` as key.py and submits (with every tool allowed: `ALL_TOOLS`)."""

    def __init__(self, content):
        self.content = content

    def make_plan(self, task):
        return [("write_file", {"path": keychain.KEY_PATH, "content": self.content}),
                ("submit", {})]


def test_generation_is_pure_split_disjoint_and_the_key_is_only_in_the_modules():
    assert TASK_SOURCES.get("keychain") is keychain.generate
    a = get_task("keychain", "train", 3)
    assert a == keychain.generate("train", 3, 0) and a.id != keychain.generate("train", 3, 1).id
    train = [keychain.generate("train", i) for i in range(300)]
    held = [keychain.generate("heldout", i) for i in range(60)]
    assert not {t.meta["key"] for t in train} & {t.meta["key"] for t in held}
    assert len({t.id for t in train}) == len(train)
    for t in train[:20] + held[:5]:
        key, parts = t.meta["key"], t.meta["parts"]
        assert "".join(parts) == key and len(key) == keychain.N_PARTS * keychain.PART_CHARS
        assert t.meta["files"] == [f"m{i}.py" for i in range(1, keychain.N_PARTS + 1)]
        for path, part in zip(t.meta["files"], parts):
            assert t.files[path].startswith(f"k{path[1]} = '{part}'\n")
        for part, letters in zip(parts, keychain.PART_ALPHABETS):
            assert set(part) <= set(letters) <= set(keychain.ALPHABET)
        # Nothing the agent sees outside the modules holds the key or a quoted part of it.
        seen = [t.prompt, t.files[keychain.KEY_PATH], t.files[keychain.TEST_PATH]]
        assert t.files[keychain.KEY_PATH] == keychain.KEY_SOURCE
        assert not any(x in s for x in [key] + [f"'{p}'" for p in parts] for s in seen)
        assert t.world_only == tuple(t.meta["files"]) and t.editable == (keychain.KEY_PATH,)
    with pytest.raises(ValueError, match="split"):
        keychain.generate("test", 0)


def test_task_json_round_trip_keeps_world_only_and_reads_older_files():
    t = keychain.generate("train", 0)
    assert Task.from_json(t.to_json()) == t
    old = get_task("generated", "train", 0).to_json().replace(', "world_only": []', "")
    assert "world_only" not in old and Task.from_json(old).world_only == ()


@pytest.mark.parametrize("index", [0, 1])
def test_graded_in_the_sandbox_and_the_parts_cannot_be_imported(index):
    task = keychain.generate("heldout", index)
    key = task.meta["key"]
    assert run_episode("oracle", task, ENV).reward == 1.0
    assert run_episode("null", task, ENV).reward == 0.0
    assert run_episode(Answer(f"def key():\n    return '{key[:-1]}x'\n"), task, ALL_TOOLS).reward == 0.0
    assert run_episode(Answer(f"def key():\n    return '{key}'\n"), task, ALL_TOOLS).reward == 1.0
    # Importing the parts works in the world but not at grading: the modules are world_only.
    imports = "from m1 import k1\nfrom m2 import k2\nfrom m3 import k3\nfrom m4 import k4\n" + (
        keychain.KEY_SOURCE[len(keychain.BLANKS):])
    r = run_episode(Answer(imports), task, ALL_TOOLS)
    assert r.reward == 0.0 and r.result.info["tests"]["test_key"]["outcome"] == "error"
    leaky = dataclasses.replace(task, world_only=())  # the same task, modules left in
    assert run_episode(Answer(imports), leaky, ALL_TOOLS).reward == 1.0


def test_a_solving_session_exceeds_the_window_and_search_and_run_are_not_offered():
    # Reading all four modules, writing the key and submitting: no window, never fits 640.
    for split, n in (("train", 20), ("heldout", 10)):
        for i in range(n):
            task = keychain.generate(split, i)
            t = scripted_trajectory(make_policy("key_collector", fix_prob=1.0), task,
                                    make_env(task, ENV), CHAT)
            assert t.reward == 1.0 and len(t.tokens) > WINDOW
    assert "run" not in ENV.tools and "search" not in ENV.tools


def _demo(task, fix_prob=1.0, compaction=COMP):
    return scripted_trajectory(make_policy("key_collector", fix_prob=fix_prob), task,
                               make_env(task, ENV), CHAT, compaction=compaction,
                               max_seq_len=WINDOW)


def test_demonstrator_carries_the_parts_through_its_summaries():
    for i in range(6):
        task = keychain.generate("train", i)
        parts = task.meta["parts"]
        t = _demo(task)
        assert t.reward == 1.0 and t.finish_reason == "submitted", (i, t.finish_reason)
        assert len(t.segments) >= 1 and len(t.tokens) > WINDOW
        assert all(b - a <= WINDOW for a, b in cl.segment_bounds(t))
        for seg in t.segments:  # "k1 = 'Q' k2 = 'H'": the parts read so far, as read
            n = seg["summary"].count(" = ")
            assert n >= 1 and seg["summary"] == " ".join(
                f"k{k + 1} = '{parts[k]}'" for k in range(n))
        # The module holding part 1 was read in the first context only: after a restart
        # the part lives on in the summaries alone.
        first_read = t.turn_texts.index(next(x for x in t.turn_texts if "m1.py" in x))
        assert first_read == 0 and sum("m1.py" in x for x in t.turn_texts) == 1
    assert _demo(keychain.generate("train", 0), fix_prob=0.0).reward == 0.0
    # Without a way to meet the window the demonstration overflows: 'context_full'.
    t = _demo(keychain.generate("train", 0), compaction=dataclasses.replace(COMP, mode="none"))
    assert t.finish_reason == "context_full" and t.reward == 0.0
