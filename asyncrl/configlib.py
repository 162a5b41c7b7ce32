"""Typed configuration machinery: nested dataclasses filled from YAML overrides and ``a.b=c`` arguments.

Every error names the key, where it came from (file and line, or the command line) and, for unknown keys,
the nearest valid key. Field documentation is the string literal under each field (cleanrl's habit), read
from the source with ``ast`` for ``--help-config``. A section may keep old key names working for a release with a
class attribute ``RENAMED = {"old": "new.dotted"}`` (relative to the section): the old key is read into the new
one, with a deprecation warning.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import logging
import math
import os
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration problem, reported before anything runs."""


@typing.runtime_checkable
class Validated(typing.Protocol):
    """A config tree or section that checks itself once loaded (a command tree checks its sections)."""

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the key, the problem and the fix."""


@typing.runtime_checkable
class WithRecipe(typing.Protocol):
    """A command's config tree whose model may ask for its own defaults (``asyncrl.models.hf.model_recipe``)."""

    def recipe(self) -> dict:
        """``{dotted key: value}`` for the keys the user leaves at their defaults."""


def load(cls, path: str | None = None, overrides: list[str] | None = None, others: tuple = ()):
    """Build ``cls`` from its defaults, then the YAML file ``path``, then ``key.sub=value`` overrides. The file
    may be one of another command's (``others``: their config classes): its top-level keys that only they know
    are left out, said in one line (a train or sft file evaluated with ``asyncrl eval --config``)."""
    cfg, given = cls(), set()
    if path:
        data, lines = _read_yaml(path)
        data = _without_foreign(data, cls, others, path)
        _merge(cfg, data, "", lambda key: f"{path}:{lines[key]}" if key in lines else path, all_keys(cls), given)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"command line: override '{item}' must look like key.sub=value")
        _merge(
            cfg, _nested(key.strip(), _override_value(item, raw)), "", lambda _k: "command line", all_keys(cls), given
        )
    for key, value in (cfg.recipe() if isinstance(cfg, WithRecipe) else {}).items():
        if key not in given:  # the model's recipe fills what the user left at its default
            _merge(
                cfg,
                _nested(key, value),
                "",
                lambda _k: f"the recipe of model.path={cfg.model.path}",
                all_keys(cls),
                set(),
            )
    if isinstance(cfg, Validated):
        cfg.validate()
    return cfg


def _without_foreign(data: dict, cls, others: tuple, path: str) -> dict:
    own = {f.name for f in dataclasses.fields(cls)} | set(getattr(cls, "RENAMED", {}))
    known = {
        name
        for other in others
        for name in [f.name for f in dataclasses.fields(other)] + list(getattr(other, "RENAMED", {}))
    }
    foreign = [k for k in data if k not in own and k in known]
    if foreign:
        log.info("%s: keys of other asyncrl commands left out: %s", path, ", ".join(map(str, foreign)))
    return {k: v for k, v in data.items() if k not in foreign}


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


SECRET_KEYS = ("admin_key", "api_key")
"""Config fields whose value is a secret: never written to a file (a dump records a set one as ``***``)."""


def flat(d: dict, prefix: str = "") -> dict[str, str]:
    """A nested config dict as ``{"a.b": json of the value}``: two configurations compare key by key."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True, default=str)
    return out


def dump(cfg, path: str | Path, mask_secrets: bool = True) -> None:
    """``cfg`` as YAML at ``path``, written aside and renamed into place (a run killed while writing it leaves the
    previous one whole: a resume reads it); secrets (``SECRET_KEYS``) as ``***`` unless ``mask_secrets`` is off (a
    configuration handed to the run's own processes)."""
    data, path = to_dict(cfg), Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump(_masked(data) if mask_secrets else data, sort_keys=False))
    os.replace(tmp, path)


def _masked(data):
    if isinstance(data, dict):
        return {k: "***" if k in SECRET_KEYS and v else _masked(v) for k, v in data.items()}
    return data


def all_keys(cls, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        typ = _resolve(cls, f)
        if dataclasses.is_dataclass(typ):
            keys += all_keys(typ, prefix + f.name + ".")
        else:
            keys.append(prefix + f.name)
    return keys


def describe(cls, prefix: str = "", default=None) -> str:
    """Every key with its type, default and documentation, for ``--help-config``. A section's defaults are those
    of the enclosing config (``default``, an instance of ``cls``; ``cls()`` when not given), which may differ from
    the section class's own (``asyncrl sft``'s ``actor.lr``)."""
    out, docs = [], field_docs(cls)
    default = cls() if default is None else default
    for f in dataclasses.fields(cls):
        typ = _resolve(cls, f)
        if dataclasses.is_dataclass(typ):
            out.append(f"\n[{prefix}{f.name}]  {docs.get(f.name, '')}".rstrip())
            out.append(describe(typ, prefix + f.name + ".", getattr(default, f.name)))
        else:
            value = getattr(default, f.name)
            out.append(f"{prefix}{f.name} = {value!r}  ({_type_name(typ)})")
            if f.name in docs:
                out.append(textwrap.indent(textwrap.fill(docs[f.name], 96), "    "))
    return "\n".join(out)


def field_docs(cls) -> dict[str, str]:
    """The string literal that follows each field in the class body."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def read_mapping(path: str | Path) -> dict:
    """A saved YAML file of a run (``config.yaml``, ``sft_config.yaml``) read with the limits of a config file
    (aliases expanding past ``MAX_YAML_NODES`` values, self-reference, nesting, non-UTF-8 text): a ConfigError
    naming the file and the problem otherwise."""
    return _read_yaml(str(path))[0]


# ---- internals -----------------------------------------------------------------------------------------
def _read_yaml(path: str) -> tuple[dict, dict[str, int]]:
    text = _read_text(path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_expansion(node, path)
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
        return data, _key_lines(node, path)
    except yaml.YAMLError as e:
        raise ConfigError(f"{_yaml_where(path, e)}: not valid YAML: {_yaml_problem(e)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply (a YAML alias that contains itself?)") from None


MAX_YAML_NODES = 100_000
"""The most values a config file may expand to: YAML aliases can make a few hundred bytes stand for billions."""


def _check_expansion(node, path: str) -> None:
    """Refuse a document whose aliases expand past ``MAX_YAML_NODES`` values, or refer to themselves."""
    count, stack, on_path = 0, [(node, False)], set()
    while stack:
        n, leaving = stack.pop()
        if leaving:
            on_path.discard(id(n))
            continue
        if id(n) in on_path:
            raise ConfigError(f"{path}:{n.start_mark.line + 1}: a YAML alias that contains itself")
        count += 1
        if count > MAX_YAML_NODES:
            raise ConfigError(
                f"{path}: expands to more than {MAX_YAML_NODES} values (YAML aliases repeating "
                "aliases?); a config file is a few hundred keys"
            )
        if isinstance(n, (yaml.SequenceNode, yaml.MappingNode)):
            on_path.add(id(n))
            stack.append((n, True))
            children = n.value if isinstance(n, yaml.SequenceNode) else [c for kv in n.value for c in kv]
            stack.extend((c, False) for c in children)


def _read_text(path: str) -> str:
    """The config file's text; a missing, unreadable or non-UTF-8 file is a ConfigError naming it."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file '{path}' does not exist")
    if p.is_dir():
        raise ConfigError(f"config file '{path}' is a directory; give a YAML file")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file '{path}' cannot be read: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x}: {e.reason})") from None


def _key_lines(node, path: str) -> dict[str, int]:
    """The line of every dotted key; a key given twice in one mapping is a ConfigError naming both lines."""
    lines: dict[str, int] = {}

    def walk(n, prefix: str) -> None:
        if isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                walk(item, f"{prefix.rstrip('.')}[{i}].")
        if not isinstance(n, yaml.MappingNode):
            return
        first: dict[str, int] = {}
        for k, v in n.value:
            if k.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden on purpose
                continue
            key, line = prefix + str(k.value), k.start_mark.line + 1
            if key in first:
                raise ConfigError(f"{path}:{line}: duplicate key '{key}' (first at line {first[key]})")
            first[key] = lines[key] = line
            walk(v, key + ".")

    walk(node, "")
    return lines


def _yaml_where(path: str, e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: the problem, then what the parser was doing and where."""
    problem = getattr(e, "problem", None)
    if not problem:
        return " ".join(str(e).split())
    context, mark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and mark:
        problem += f" ({context} at line {mark.line + 1}, column {mark.column + 1})"
    elif context:
        problem += f" ({context})"
    return problem


def _override_value(item: str, raw: str):
    """The YAML value of ``key=raw``; a text with ' #' in it is that text (a command line holds no YAML comment:
    'prompt_template=Solve {question} #show your work' keeps its end)."""
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"command line: override '{item}': not valid YAML: {_yaml_problem(e)}") from None
    return raw.strip() if isinstance(value, str) and " #" in raw and " #" not in value else value


def _nested(dotted: str, value: Any) -> dict:
    """``a.b.c``, v -> ``{"a": {"b": {"c": v}}}``."""
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


def _merge(cfg, data: dict, prefix: str, where, valid: list[str], given: set[str]) -> None:
    """Set ``data``'s keys on ``cfg`` (the dotted names set go into ``given``)."""
    cls = type(cfg)
    names = {f.name: f for f in dataclasses.fields(cls)}
    renamed = getattr(cls, "RENAMED", {})
    for key, value in data.items():
        dotted = prefix + str(key)
        if key not in names and key in renamed:
            new = renamed[key]
            log.warning(
                "%s: '%s' is deprecated: use '%s' (the old name stops working in the next release)",
                where(dotted),
                dotted,
                prefix + new,
            )
            for part in reversed(new.split(".")):
                value = {part: value}
            _merge(cfg, value, prefix, where, valid, given)
            continue
        if key not in names:
            near = difflib.get_close_matches(dotted, valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{near[0]}'?" if near else f"; valid keys here: {sorted(names)}"
            raise ConfigError(f"{where(dotted)}: unknown config key '{dotted}'{hint}")
        f = names[key]
        typ = _resolve(cls, f)
        if dataclasses.is_dataclass(typ):
            if not isinstance(value, dict):
                raise ConfigError(f"{where(dotted)}: '{dotted}' is a section; give a mapping, not {value!r}")
            _merge(getattr(cfg, key), value, dotted + ".", where, valid, given)
        else:
            setattr(cfg, key, _coerce(value, typ, dotted, where))
            given.add(dotted)


def _coerce(value, typ, key: str, where):
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, where)
            except ConfigError as e:
                errors.append(e)
        arms = [a for a in args if a is not type(None)]
        if len(arms) == 1 or "finite number" in str(errors[0]):  # a non-finite number is not another arm's value
            raise errors[0]
        names = " or ".join(
            repr(a.__args__[0]) if typing.get_origin(a) is typing.Literal else _type_name(a) for a in arms
        )
        raise ConfigError(f"{where(key)}: '{key}' must be {names}, got {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where(key)}: '{key}' must be one of {list(args)}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where(key)}: '{key}' must be a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, key, where) for v in value]
        return tuple(items) if origin is tuple else items
    if typ is Any:
        return value
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -(2**63) <= value < 2**63:
                raise ConfigError(
                    f"{where(key)}: '{key}' must be a 64-bit integer (below 2**63 in size), got "
                    f"{str(value)[:30]}{'...' if len(str(value)) > 30 else ''}"
                )
            return value
    elif typ is float:
        number = _as_float(value)
        if number is not None and math.isfinite(number):
            return number
        if number is not None:
            raise ConfigError(f"{where(key)}: '{key}' must be a finite number, got {number}")
    elif typ is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif typ is dict:
        if isinstance(value, dict):
            return value
    raise ConfigError(f"{where(key)}: '{key}' must be {_type_name(typ)}, got {value!r}")


def _as_float(value) -> float | None:
    """``value`` as a float (NaN and inf included), or None when it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer literal too large for a float
            return math.inf
    return None


def _type_name(typ) -> str:
    return getattr(typ, "__name__", None) or str(typ).replace("typing.", "")


def _resolve(cls, f: dataclasses.Field):
    return typing.get_type_hints(cls)[f.name]
