"""A hardened YAML loader: bounded nesting and size, so that a hostile or broken ConfigMap
value is a clear problem, not a hang or a crash."""

from __future__ import annotations

from typing import Any

import yaml

from localpv.config.model import ConfigError

#: Deeper values are refused: no key needs more than a few levels, and both PyYAML's composer
#: and anything walking the value recurse once per level (2,000 levels raise RecursionError,
#: which would kill the config reload thread).
MAX_NESTING = 64


#: Values in one document, counting every use of an alias: anchors can expand exponentially.
MAX_VALUES = 100_000


class _TooDeep(yaml.YAMLError):
    def __init__(self, key: str, mark: yaml.Mark | None) -> None:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        super().__init__(f"{key + ': ' if key else ''}expected at most {MAX_NESTING} levels of nesting, "
                         f"found more{where}")
        self.key = key
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """SafeLoader that stops composing below :data:`MAX_NESTING` levels, naming the top-level key."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._top_key = ""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self._depth == 1:  # a top-level entry: remember which, for the message
            self._top_key = str(index.value) if isinstance(index, yaml.ScalarNode) else (
                f"[{index}]" if isinstance(index, int) else self._top_key)
        if self._depth > MAX_NESTING:
            raise _TooDeep(self._top_key, self.peek_event().start_mark)  # type: ignore[no-untyped-call]
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _shape_problem(doc: Any) -> tuple[str, str] | None:
    """(top-level key, problem) when ``doc`` nests deeper than :data:`MAX_NESTING` or holds more
    than :data:`MAX_VALUES` values. The composer bounds what is written out; this bounds what
    aliases build (a chain of anchors, a list that contains itself, a billion laughs). Iterative."""
    stack: list[tuple[Any, int, str]] = [(doc, 0, "")]
    count = 0
    while stack:
        value, depth, key = stack.pop()
        count += 1
        if depth > MAX_NESTING:
            return key, f"expected at most {MAX_NESTING} levels of nesting, found more (through aliases)"
        if count > MAX_VALUES:
            return key, f"expected at most {MAX_VALUES} values, found more (through aliases)"
        if isinstance(value, dict):
            stack.extend((item, depth + 1, key or str(name)) for name, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, depth + 1, key or f"[{i}]") for i, item in enumerate(value))
    return None


def _compose_and_construct(text: str) -> Any:
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def safe_load_limited(text: str) -> Any:
    """``yaml.safe_load`` that raises ``yaml.YAMLError`` for values nested too deeply or too
    large (see :data:`MAX_NESTING`, :data:`MAX_VALUES`) instead of recursing without bound."""
    doc = _compose_and_construct(text)
    shape = _shape_problem(doc)
    if shape is not None:
        raise yaml.YAMLError(f"{shape[0]}: {shape[1]}" if shape[0] else shape[1])
    return doc


def _load_yaml(text: str, path: str, *, key: str | None = None) -> Any:
    """Parse one document; ``path`` says where it came from, ``key`` which configuration key it
    holds (a file of a mounted ConfigMap, a ``data`` entry), if it holds just one."""
    try:
        doc = _compose_and_construct(text)
    except _TooDeep as err:
        where = f"line {err.mark.line + 1}, column {err.mark.column + 1}" if err.mark else "somewhere"
        name = key or err.key or path
        source = "" if key else f" of {path}"
        raise ConfigError([f"{name}: expected at most {MAX_NESTING} levels of nesting, "
                           f"found more ({where}{source})"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError([f"{path}: not valid YAML{where}: {problem}"]) from err
    shape = _shape_problem(doc)
    if shape is not None:
        name = key or shape[0] or path
        raise ConfigError([f"{name}: {shape[1]}" + ("" if key else f" (in {path})")])
    return doc
