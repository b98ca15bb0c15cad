"""Typed, validated experiment configs: a schema per kind, checked before any work starts.

An experiment file returns an `ml_collections.ConfigDict`; `validate(config, schema)`
checks it against a `Section` of `Field`s and fills in the defaults, so the code reading
the config needs no `.get(key, default)`: each default lives in the schema, next to what it
means. Errors are `ConfigError`s naming the field and what is allowed:

  config.rl.stesp: unknown field; known: [...]
  config.rl.mode: 'asynch'; choose one of ['async', 'sync']
  config.rl.slots: expected int >= 1, got 0

Needs no JAX: registries whose names are allowed values are passed as callables and read
only when a config is validated.
"""
import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import ml_collections


class ConfigError(ValueError):
  """A config value is missing, unknown, of the wrong type or out of range."""


_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool", tuple: "sequence"}


@dataclasses.dataclass(frozen=True)
class Field:
  """One value: its default, type, and the values allowed (`choices`: a sequence or a
  callable returning one; `min`/`max`: inclusive bounds; `check`: returns an error text or
  None). `optional=True` also allows None."""
  default: Any
  kind: type
  doc: str = ""
  choices: Union[Sequence, Callable[[], Sequence], None] = None
  min: Optional[float] = None
  max: Optional[float] = None
  check: Optional[Callable[[Any], Optional[str]]] = None
  optional: bool = False


@dataclasses.dataclass(frozen=True)
class Free:
  """A mapping passed through as it is (keyword arguments of a registered policy)."""
  doc: str = ""


@dataclasses.dataclass(frozen=True)
class Dataclass:
  """A section whose fields are a dataclass's (`load` returns the class, imported when a
  config is validated); constructing it runs the dataclass's own checks. `exclude`: fields
  the controller sets itself."""
  load: Callable[[], type]
  doc: str = ""
  exclude: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Section:
  fields: Mapping[str, Any]  # name -> Field | Section | Free | Dataclass
  doc: str = ""


def _type_ok(value, kind) -> bool:
  if kind is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if kind is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if kind is tuple:
    return isinstance(value, (tuple, list))
  return isinstance(value, kind)


def _check_field(path: str, f: Field, value) -> Any:
  if value is None and f.optional:
    return None
  if not _type_ok(value, f.kind):
    raise ConfigError(f"{path}: expected {_TYPE_NAMES.get(f.kind, f.kind.__name__)}"
                      f"{' or None' if f.optional else ''}, got {value!r}")
  if f.kind is float:
    value = float(value)
  if f.kind is tuple:
    value = tuple(value)
  if f.choices is not None:
    allowed = list(f.choices() if callable(f.choices) else f.choices)
    items = value if f.kind is tuple else (value,)
    for v in items:
      if v not in allowed:
        raise ConfigError(f"{path}: {v!r}; choose one of {sorted(allowed, key=str)}")
  lo, hi = f.min, f.max
  if (lo is not None and value < lo) or (hi is not None and value > hi):
    bound = (f"in [{lo}, {hi}]" if lo is not None and hi is not None
             else f">= {lo}" if lo is not None else f"<= {hi}")
    raise ConfigError(f"{path}: expected {_TYPE_NAMES.get(f.kind)} {bound}, got {value!r}")
  if f.check is not None:
    problem = f.check(value)
    if problem:
      raise ConfigError(f"{path}: {problem}, got {value!r}")
  return value


def _set(node, key: str, value) -> None:
  if isinstance(node, ml_collections.ConfigDict):
    with node.unlocked():
      node[key] = value
  else:
    node[key] = value


def _empty_like(node):
  return ml_collections.ConfigDict() if isinstance(node, ml_collections.ConfigDict) else {}


def _known_error(path: str, key: str, known) -> ConfigError:
  return ConfigError(f"{path}.{key}: unknown field; known: {sorted(known)}")


def _check_dataclass(path: str, spec: Dataclass, node) -> None:
  cls = spec.load()
  known = {f.name for f in dataclasses.fields(cls)} - set(spec.exclude)
  for k in node:
    if k not in known:
      raise _known_error(path, k, known)
  defaults = {f.name: f.default for f in dataclasses.fields(cls)
              if f.default is not dataclasses.MISSING}
  for k in node:  # the dataclass's default value says the type
    d, v = defaults.get(k), node[k]
    if d is not None and not isinstance(d, (tuple, list, dict)):
      kind = float if isinstance(d, float) else type(d)
      if not _type_ok(v, kind) and not (v is None and k in _optional_fields(cls)):
        raise ConfigError(f"{path}.{k}: expected {_TYPE_NAMES.get(kind, kind.__name__)}, "
                          f"got {v!r}")
  values = node.to_dict() if isinstance(node, ml_collections.ConfigDict) else dict(node)
  try:
    cls(**values)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{path}: {e}") from None


def _optional_fields(cls) -> set:
  return {f.name for f in dataclasses.fields(cls) if "Optional" in str(f.type)}


def validate(config, schema: Section, path: str = "config") -> None:
  """Checks `config` (a ConfigDict or dict) against `schema`, in place: fills in missing
  fields with their defaults. Raises ConfigError naming the first bad field."""
  if not hasattr(config, "keys"):
    raise ConfigError(f"{path}: expected a section (a mapping), got {config!r}")
  for k in list(config.keys()):
    if k not in schema.fields:
      raise _known_error(path, k, schema.fields)
  for name, spec in schema.fields.items():
    where = f"{path}.{name}"
    present = name in config
    if isinstance(spec, Field):
      value = _check_field(where, spec, config[name] if present else spec.default)
      if not present:
        _set(config, name, value)
    elif isinstance(spec, Section):
      if not present:
        _set(config, name, _empty_like(config))
      validate(config[name], spec, where)
    elif isinstance(spec, Dataclass):
      if not present:
        _set(config, name, _empty_like(config))
      _check_dataclass(where, spec, config[name])
    elif isinstance(spec, Free):
      if not present:
        _set(config, name, _empty_like(config))
      elif not hasattr(config[name], "keys"):
        raise ConfigError(f"{where}: expected a mapping, got {config[name]!r}")
    else:
      raise TypeError(f"schema entry {where}: {spec!r}")


def describe(schema: Section, path: str = "config") -> Dict[str, str]:
  """Field path -> 'default: doc' (for docs and `--help`-style listings)."""
  out = {}
  for name, spec in schema.fields.items():
    where = f"{path}.{name}"
    if isinstance(spec, Section):
      out.update(describe(spec, where))
    elif isinstance(spec, Field):
      out[where] = f"{spec.default!r}: {spec.doc}"
    else:
      out[where] = spec.doc
  return out
