"""Run one shell command in a fresh sandboxed world, exactly as a rollout's `run` tool would.

    python launch/sandbox_exec.py [--json] [--timeout=S] [--task=generated:train:0] -- COMMAND...

Prints the command's stdout/stderr and exits with its status; with --json prints
{"exit_code", "stdout", "stderr", "timed_out", "killed_reason"} instead (exit status 0).
--task fills the world with a task's files (source:split:index), for debugging a task.
"""
import argparse
import sys

from composer_rl.env.cli import sandbox_exec_main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print a JSON result object")
    parser.add_argument("--timeout", type=float, default=None, help="wall-clock seconds")
    parser.add_argument("--task", default=None, help="source:split:index, e.g. generated:train:0")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("no command given (use -- COMMAND)")
    sys.exit(sandbox_exec_main(" ".join(cmd), as_json=args.json, timeout_s=args.timeout,
                               task_spec=args.task))
