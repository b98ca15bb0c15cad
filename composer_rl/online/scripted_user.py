"""A scripted user of the OpenAI-compatible server: works through tasks over the API and
gives feedback by a fixed preference.

It is a separate process that uses only the official `openai` package and the standard
library (nothing of composer_rl), the way a real client would. For each task (a JSONL line
with `id`, `prompt`, `answer`) it asks the served model in a fresh conversation, then posts
feedback to /v1/feedback: `accepted` when the reply is the bare correct answer (concise and
correct), `rejected` otherwise. With --stop_file it cycles through the tasks until that
file exists (the trainer's "enough"); one JSON line per conversation goes to --out.

  python composer_rl/online/scripted_user.py --base_url=http://127.0.0.1:8000/v1 \
      --model=online_rl --tasks=tasks.jsonl --out=replies.jsonl --temperature=1.0
"""
import argparse
import concurrent.futures as cf
import itertools
import json
import os
import sys
import threading

import openai


def accepts(answer: str, reply: str) -> bool:
  """The fixed preference: the reply is the bare answer (code quotes allowed)."""
  return reply.strip().strip("`").strip() == answer


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--base_url", required=True)
  p.add_argument("--api_key", default="none")
  p.add_argument("--model", required=True)
  p.add_argument("--tasks", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--temperature", type=float, default=1.0)
  p.add_argument("--max_tokens", type=int, default=48)
  p.add_argument("--feedback", type=int, default=1, help="post feedback (1) or not (0)")
  p.add_argument("--consent", default="true", help="X-Training-Consent header value")
  p.add_argument("--workers", type=int, default=8, help="conversations at once")
  p.add_argument("--stop_file", default="", help="cycle through the tasks until it exists")
  p.add_argument("--tag", default="", help="prefix of conversation ids")
  a = p.parse_args()
  client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=5, timeout=600)
  with open(a.tasks) as f:
    tasks = [json.loads(line) for line in f if line.strip()]
  lock = threading.Lock()
  out = open(a.out, "a")
  stop = threading.Event()

  def one(k_task):
    k, task = k_task
    conv = f"{a.tag}{task['id']}-{k}"
    resp = client.chat.completions.create(
        model=a.model, messages=[{"role": "user", "content": task["prompt"]}],
        temperature=a.temperature, max_tokens=a.max_tokens,
        extra_headers={"X-Conversation-Id": conv, "X-Training-Consent": a.consent})
    reply = resp.choices[0].message.content or ""
    ok = accepts(task["answer"], reply)
    if a.feedback:
      client.post("/feedback", cast_to=object, body={
          "conversation_id": conv, "completion_id": resp.id,
          "signal": "accepted" if ok else "rejected"})
    with lock:
      out.write(json.dumps({"task_id": task["id"], "conversation_id": conv, "reply": reply,
                            "accepted": ok, "completion_id": resp.id,
                            "fingerprint": resp.system_fingerprint}) + "\n")
      out.flush()
      if a.stop_file and os.path.exists(a.stop_file):
        stop.set()

  jobs = enumerate(itertools.cycle(tasks) if a.stop_file else tasks)
  with cf.ThreadPoolExecutor(a.workers) as pool:
    pending = set()
    for job in jobs:
      if stop.is_set():
        break
      pending.add(pool.submit(one, job))
      if len(pending) >= a.workers:
        done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
        for d in done:
          d.result()  # a failed request fails the user loudly
    for d in cf.as_completed(pending):
      d.result()
  out.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
