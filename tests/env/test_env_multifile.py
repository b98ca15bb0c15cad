"""The long-session task family ("multifile") and its demonstrator (`long_weak_oracle`):
graded by the real tamper-proof grader in the sandbox; a session that reads every module
does not fit its 1024-token window; the demonstrator summarizes exactly where
the rollout runner would ask the model to, in the runner's token layout."""
import dataclasses

import pytest

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env import run_episode
from composer_rl.env.harness import EnvConfig, make_env
from composer_rl.env.policies import ScriptedPolicy, make_policy
from composer_rl.env.tasks import TASK_SOURCES, get_task, multifile
from composer_rl.rollout import compaction as cl
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.scripted import scripted_trajectory

# The settings the family was designed for (the first compaction experiment; the current
# one runs the "keychain" family, tests/env/test_env_keychain.py).
WINDOW = 1024
COMP = cl.CompactionConfig(enabled=True, trigger_fraction=0.55, max_compactions=4,
                           summary_max_tokens=64)
ENV = EnvConfig(call_syntax="tool_compact", max_turns=10, system_prompt="Fix the bug, then submit.")


class ReadAll(ScriptedPolicy):
    """Reads every module, then submits (what a session without memory would need)."""

    def make_plan(self, task):
        return [("read_file", {"path": p}) for p in task.meta["files"]] + [("submit", {})]


def test_generation_is_pure_split_disjoint_and_hides_the_module():
    assert TASK_SOURCES.get("multifile") is multifile.generate
    a, b = get_task("multifile", "train", 3), multifile.generate("train", 3, 0)
    assert a == b and a.id != multifile.generate("train", 3, 1).id
    train = [multifile.generate("train", i) for i in range(150)]
    held = [multifile.generate("heldout", i) for i in range(30)]
    assert not {tuple(t.meta["variant"]) for t in train} & {tuple(t.meta["variant"]) for t in held}
    assert len({t.id for t in train}) == len(train)
    assert len({t.meta["target_position"] for t in train}) == multifile.N_FILES
    for t in train[:20]:
        target = t.oracle[0].path
        assert t.module + ".py" == target and set(t.editable) == set(t.meta["files"])
        assert all(p in t.prompt for p in t.meta["files"]) and t.meta["func"] in t.prompt
        # Nothing outside the modules tells which one holds the function.
        assert all(f"from {p[:-3]} import *" in t.files[multifile.TEST_PATH]
                   for p in t.meta["files"])
        assert sum(f"def {t.meta['func']}(" in t.files[p] for p in t.meta["files"]) == 1
        assert f"def {t.meta['func']}(" in t.files[target]


def test_numbered_source_is_the_same_tasks_with_fixed_module_names():
    for i in range(5):
        a, b = multifile.generate("train", i), get_task("multifile_numbered", "train", i)
        assert b.meta["files"] == [f"m{k}.py" for k in range(1, multifile.N_FILES + 1)]
        assert (b.meta["func"], b.meta["target_position"], b.meta["variant"]) == (
            a.meta["func"], a.meta["target_position"], a.meta["variant"])
        assert b.module == f"m{a.meta['target_position'] + 1}" and b.id != a.id
    task = get_task("multifile_numbered", "train", 0)
    assert run_episode("oracle", task, ENV).reward == 1.0


@pytest.mark.parametrize("index", [0, 1, 2])
def test_oracle_solves_and_null_does_not_in_the_sandbox(index):
    task = multifile.generate("train", index)
    assert run_episode("oracle", task, ENV).reward == 1.0
    assert run_episode("null", task, ENV).reward == 0.0
    # Editing the wrong module does not count: the checks call the buggy module.
    wrong = next(p for p in task.meta["files"] if p != task.oracle[0].path)

    class WrongFile(ScriptedPolicy):
        def make_plan(self, t):
            e = t.oracle[0]
            return [("write_file", {"path": wrong, "content": t.fixed_files()[e.path]}),
                    ("submit", {})]
    assert run_episode(WrongFile(), task, ENV).reward == 0.0


def test_reading_every_module_exceeds_the_window():
    chat = ChatFormat(ByteTokenizer())
    lengths = []
    for i in range(4):
        task = multifile.generate("heldout", i)
        t = scripted_trajectory(ReadAll(), task, make_env(task, ENV), chat)
        lengths.append(len(t.tokens))
    assert min(lengths) > WINDOW, lengths


def test_demonstrator_summarizes_where_the_runner_would_and_fixes():
    chat = ChatFormat(ByteTokenizer())
    tok = chat.tok
    compacted = 0
    for i in range(6):
        task = multifile.generate("train", i)
        t = scripted_trajectory(make_policy("long_weak_oracle", fix_prob=1.0, run_tests=False),
                                task, make_env(task, ENV), chat, compaction=COMP,
                                max_seq_len=WINDOW)
        assert t.reward == 1.0 and t.finish_reason == "submitted", (i, t.finish_reason)
        bounds = cl.segment_bounds(t)
        assert all(b - a <= WINDOW for a, b in bounds)
        assert t.metrics.get("compactions", 0) == len(t.segments)
        for k, seg in enumerate(t.segments):
            a = bounds[k + 1][0]
            ids = tok.encode(seg["summary"])
            assert t.tokens[a:a + len(cl.restart_tokens(chat, "", t.prompt, ids))] == (
                cl.restart_tokens(chat, "", t.prompt, ids))
            # The summary turn closes the previous context and is trained (sampled).
            end = a - 1
            assert t.tokens[end] == tok.EOT and t.tokens[end - len(ids):end] == ids
            assert all(t.loss_mask[end - len(ids):end])
            assert seg["summary"].startswith(task.meta["func"] + ":")
        if t.segments:
            compacted += 1
            # The last summary carries what the next context needs.
            assert task.oracle[0].path in t.segments[-1]["summary"] or "not in" in (
                t.segments[-1]["summary"])
    assert compacted >= 3
    # An imperfect demonstrator: reads, summarizes, then gives up on some tasks.
    task = multifile.generate("train", 0)
    t = scripted_trajectory(make_policy("long_weak_oracle", fix_prob=0.0), task,
                            make_env(task, ENV), chat, compaction=COMP, max_seq_len=WINDOW)
    assert t.reward == 0.0
    # Without compaction the same demonstration overflows the window: 'context_full'.
    far = next(multifile.generate("train", i) for i in range(50)
               if multifile.generate("train", i).meta["target_position"] == multifile.N_FILES - 1)
    t = scripted_trajectory(make_policy("long_weak_oracle", fix_prob=1.0), far,
                            make_env(far, ENV), chat,
                            compaction=dataclasses.replace(COMP, mode="none"), max_seq_len=WINDOW)
    assert t.finish_reason == "context_full" and t.reward == 0.0
