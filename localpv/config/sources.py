"""Where a configuration comes from: a mounted ConfigMap directory (one file per key, the
``..data`` symlink and timestamped directories skipped), a YAML file of keys, a ConfigMap
manifest (or several documents, as ``helm template`` prints), or standard input."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from localpv.config.model import ConfigError, LoadedConfig
from localpv.config.schema import parse_config
from localpv.config.values import _describe
from localpv.config.yamlload import MAX_NESTING, _load_yaml, _Loader, _shape_problem, _TooDeep

MAX_CONFIG_BYTES = 8 << 20

"""Largest configuration file read: a ConfigMap holds at most 1 MiB, and `helm template`
output with one in it stays well under this. The bound keeps `config check /dev/zero` (or a
log file named by mistake) from reading without end."""


class _NotAConfigFile(Exception):
    """A path that cannot hold a configuration: not a regular file, or far too large."""


def _read_text(path: Path) -> str:
    """A configuration file's text, refusing devices, FIFOs and sockets (reading them blocks
    or never ends) and anything larger than :data:`MAX_CONFIG_BYTES`."""
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise _NotAConfigFile(f"expected a regular file, found {_file_kind(st.st_mode)}")
    with path.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise _NotAConfigFile(f"expected at most {MAX_CONFIG_BYTES >> 20} MiB, found a larger file")
    return raw.decode("utf-8")


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def read_config_data(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read raw key/value data from a mounted ConfigMap directory or a YAML file."""
    p = Path(path)
    if p.is_dir():
        data, errors = _read_directory(p)
        if errors:
            raise ConfigError(errors)
        return data
    try:
        text = _read_text(p)
    except (OSError, UnicodeDecodeError, _NotAConfigFile) as err:
        raise ConfigError([f"{p}: cannot read configuration: {err}"]) from err
    return _data_from_text(text, p)


def _read_directory(p: Path) -> tuple[dict[str, Any], list[str]]:
    """Every key of a mounted ConfigMap directory that can be read, and why the others cannot."""
    data: dict[str, Any] = {}
    errors: list[str] = []
    for child in sorted(p.iterdir()):
        # Kubernetes mounts keys as symlinks into a timestamped dot-directory.
        if child.name.startswith(".") or child.is_dir():
            continue
        # Every file is read, so that all the problems of a mounted ConfigMap are said at once.
        try:
            text = _read_text(child)
            data[child.name] = _load_yaml(text, child.name, key=child.name)
        except (OSError, UnicodeDecodeError, _NotAConfigFile) as err:
            errors.append(f"{child.name}: cannot read {child}: {err}")
        except ConfigError as err:
            errors += err.problems
    return data, errors


def read_config_stream(stream: BinaryIO, name: str = "<stdin>") -> dict[str, Any]:
    """Like :func:`read_config_data` for one file's content on a stream (``config check -``,
    so that ``helm template ... | localpv config check -`` works), read up to the same bound."""
    raw = stream.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{name}: cannot read configuration: expected at most {MAX_CONFIG_BYTES >> 20} MiB, "
                           "found more"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError([f"{name}: cannot read configuration: {err}"]) from err
    return _data_from_text(text, Path(name))


def _data_from_text(text: str, p: Path) -> dict[str, Any]:
    """The configuration keys of one file: a plain mapping of keys, a ConfigMap, or a stream
    of documents with one provisioner ConfigMap among them."""
    doc = _pick_config_map(text, p) if _has_several_documents(text) else _load_yaml(text, str(p))
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError([f"{p}: expected a mapping of configuration keys, got {_describe(doc)}"])
    if doc.get("kind") == "ConfigMap":
        raw = doc.get("data") or {}
        if not isinstance(raw, dict):
            raise ConfigError([f"{p}: data: expected a mapping, got {_describe(raw)}"])
        return {str(k): _load_yaml(str(v), str(k), key=str(k)) for k, v in raw.items()}
    return doc


_DOCUMENT_START = re.compile(r"^---", re.MULTILINE)


def _has_several_documents(text: str) -> bool:
    """Whether ``text`` may hold more than one YAML document (a ``---`` after some content)."""
    starts = [m.start() for m in _DOCUMENT_START.finditer(text)]
    return any(text[:start].strip(" \t\r\n") and not _only_comments(text[:start]) for start in starts)


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith(("#", "%")) for line in text.splitlines())


def _pick_config_map(text: str, p: Path) -> Any:
    """The provisioner's ConfigMap out of a multi-document stream (``helm template`` output):
    the ConfigMap whose data has ``storageClassMap``; an error naming them when several do."""
    docs: list[Any] = []
    try:
        loader = _Loader(text)
        try:
            while loader.check_data():  # type: ignore[no-untyped-call]
                docs.append(loader.get_data())
        finally:
            loader.dispose()
    except _TooDeep as err:
        where = f" (line {err.mark.line + 1}, column {err.mark.column + 1})" if err.mark else ""
        raise ConfigError([f"{p}: expected at most {MAX_NESTING} levels of nesting, found more{where}"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError([f"{p}: not valid YAML{where}: {problem}"]) from err
    for doc in docs:
        if (shape := _shape_problem(doc)) is not None:
            raise ConfigError([f"{shape[0] or p}: {shape[1]} (in {p})"])
    real = [d for d in docs if d is not None]
    if len(real) <= 1:
        return real[0] if real else None
    candidates = [d for d in real if isinstance(d, dict) and d.get("kind") == "ConfigMap"
                  and isinstance(d.get("data"), dict) and "storageClassMap" in d["data"]]
    if len(candidates) == 1:
        return candidates[0]

    def name(doc: dict[str, Any]) -> str:
        meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
        namespace = meta.get("namespace")
        return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))

    if candidates:
        raise ConfigError([f"{p}: expected one ConfigMap with storageClassMap among its {len(real)} documents, "
                           f"found {len(candidates)}: {', '.join(name(d) for d in candidates)}"])
    raise ConfigError([f"{p}: expected a ConfigMap with storageClassMap among its {len(real)} documents, "
                       "found none"])


def load_config(path: str | os.PathLike[str] | BinaryIO, *, strict: bool = False) -> LoadedConfig:
    """Read and validate a configuration directory, file or stream; raise :class:`ConfigError`
    (``strict``: see :func:`parse_config`).

    Never anything else for what the files hold: the agent's reload thread keeps the last
    good configuration on ConfigError, and any other exception would end it.
    """
    name = "<stdin>" if not isinstance(path, str | os.PathLike) else path
    try:
        if isinstance(path, str | os.PathLike) and Path(path).is_dir():
            data, unreadable = _read_directory(Path(path))
            if unreadable:
                # The keys that could be read are still checked: all the problems at once.
                problems, warnings = _findings(data, strict)
                raise ConfigError(unreadable + problems, warnings)
        else:
            data = read_config_data(path) if isinstance(path, str | os.PathLike) else read_config_stream(path)
        return parse_config(data, strict=strict)
    except RecursionError:  # a last guard: the readers above bound nesting already
        raise ConfigError([f"{name}: nested too deeply to be read"]) from None



def _findings(data: dict[str, Any], strict: bool) -> tuple[list[str], tuple[str, ...]]:
    """The problems and warnings of ``data``, whether or not it is a valid configuration."""
    try:
        return [], parse_config(data, strict=strict).warnings
    except ConfigError as err:
        return err.problems, err.warnings
