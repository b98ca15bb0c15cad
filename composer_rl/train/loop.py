"""The one training loop: data -> step -> metrics -> checkpoint, resumable exactly.

Every path that trains step by step runs this loop: the plain trainer (`train/trainer.py`:
SFT, pretraining, synthetic RL), agent RL from rollouts (`controller/agent_rl.py`) and
online RL from served sessions (`controller/online_rl.py`). What differs is passed in:

  fetch(k, state) -> item            the data of step k: a batch, rollout groups, sessions;
  update(k, state, item) -> (state, metrics)
                                     the step, and what follows it (publishing weights,
                                     recording consumed groups);
  save(done, state)                  a checkpoint after `done` steps, with whatever the
                                     caller's exact resume needs (a data iterator's state,
                                     a rollout ledger); every `checkpoint_every` steps and
                                     after the last.

A resumed run calls the loop with `start` = the restored step; the metrics log is cut back
to that step by the caller (`MetricsWriter.truncate_phase`), so its rows are those of an
uninterrupted run. Each row gets `seconds` (since this loop began) and is written under
`phase` at `k + row_offset`.
"""
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from composer_rl.progress import progress


def run(state, *, start: int, steps: int, phase: str, label: str,
        fetch: Callable[[int, Any], Any],
        update: Callable[[int, Any, Any], Tuple[Any, Dict[str, float]]],
        metrics=None, save: Optional[Callable[[int, Any], None]] = None,
        checkpoint_every: int = 1, echo_every: int = 1, row_offset: int = 0,
        show_progress: bool = True) -> Tuple[Any, List[Dict[str, float]]]:
  """Runs steps `start`..`steps - 1`; returns (state, each step's metrics).

  metrics: a `MetricsWriter` (None: write nothing, e.g. a non-chief process).
  echo_every: print a step's main values every this many steps, and at the last step.
  label: what the progress bar calls the loop ('SFT', 'RL', ...).
  """
  if checkpoint_every < 1 or echo_every < 1:
    raise ValueError(f"checkpoint_every={checkpoint_every} and echo_every={echo_every} "
                     "must be >= 1")
  t0, history = time.time(), []
  for k in progress(steps - start, label, "steps", iterable=range(start, steps),
                    disable=not show_progress):
    state, m = update(k, state, fetch(k, state))
    m["seconds"] = round(time.time() - t0, 3)
    history.append(m)
    done = k + 1
    if metrics is not None:
      metrics.write(k + row_offset, m, phase=phase,
                    echo=done % echo_every == 0 or done == steps)
    if save is not None and (done % checkpoint_every == 0 or done == steps):
      save(done, state)
  return state, history
