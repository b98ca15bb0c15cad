"""Task sources, chosen by name from `TASK_SOURCES`.

A source is a callable `(split: str, index: int, seed: int) -> Task`; "generated" is the
seeded bug-family generator, "multifile" its long-session variant (the buggy function
hides in one of several modules), "keychain" (the answer is a key gathered from modules
that do not all fit the window), "toolz" the real-repository tasks built from the vendored
toolz sdist. Tasks written by `launch/make_tasks.py` load with `repo_builder.load_tasks(dir)`.
"""
from composer_rl.env.tasks.task import Edit, Task  # noqa: F401
from composer_rl.env.tasks.registry import TASK_SOURCES, get_task  # noqa: F401
# The built-in sources register themselves on import, so TASK_SOURCES lists them as soon as
# the package is imported.
from composer_rl.env.tasks import generated, keychain, multifile, realrepo  # noqa: F401,E402
