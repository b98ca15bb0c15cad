"""Registry of task sources (name -> `(split, index, seed, **args) -> Task`; `args` are the
source's own settings, e.g. the "dir" source's `path`)."""
from composer_rl.env.registry import Registry

TASK_SOURCES: Registry = Registry("task source")


def get_task(source: str, split: str = "train", index: int = 0, seed: int = 0, **args):
    # Import for registration side effects (sources register themselves on import).
    from composer_rl.env.tasks import generated, keychain, multifile, realrepo  # noqa: F401
    return TASK_SOURCES.get(source)(split, index, seed, **args)
