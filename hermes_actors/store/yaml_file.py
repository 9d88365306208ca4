"""Reading YAML files that may be hostile: symlinked, huge, malformed or not a mapping.

:func:`read_yaml_mapping` reports the problem as text instead of logging it, so
a caller that reads the same file repeatedly (``config.yaml`` is read by the
CLI, the gateway and the roster) can decide how often to say it;
:func:`load_yaml_file` logs it, once while it lasts (:func:`warn_once`, the one
implementation of that rule: the roster and the hub re-read every ``profile.yaml``
at each rescan); :func:`warned_while_failing` applies the same rule to a step run
again and again (a relay rescan, a heartbeat or roster write).
"""

from __future__ import annotations

import bisect
import errno
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from loguru import logger

from hermes_actors.store.os_errors import advised, resource_failure

# The C parser (libyaml) is ~7x faster; 10,000 profile.yaml files are read at start.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

__all__ = [
    "MAX_CONFIG_BYTES", "MAX_EXPANDED_VALUES", "MAX_NESTING", "comment_lines", "expanded_size", "load_bounded",
    "load_yaml_file", "read_yaml_mapping", "too_deep", "warn_once", "warned_while_failing",
]

MAX_CONFIG_BYTES = 1024 * 1024
# Values a file may hold once its aliases are expanded: YAML anchors nest cheaply ("billion laughs"), and
# every reader that walks, merges or prints the result would expand them.
MAX_EXPANDED_VALUES = 100_000
# Collections a file may nest (aliases expanded). No Hermes config comes close; what reads the result recurses
# (copy.deepcopy in the config merge: ~1,000 levels raise RecursionError, and libyaml's composer, which builds
# the node graph recursively in C, crashes the process on ~100,000).
MAX_NESTING = 64


_said_lock = threading.Lock()
_said: dict[str, frozenset[str]] = {}  # what → the problems its last report logged (only those with some)


def warn_once(what: str, problems: Iterable[str]) -> None:
    """Log each of ``problems`` that the previous report on ``what`` did not have.

    A file read again and again (every rescan, by every reader in the process) gives
    one warning per problem while it lasts, and again once it went and came back.

    Args:
        what: the subject the problems are about (a file's path; one key per kind of report on it).
        problems: one line each (the file's current ones: an empty list clears it).
    """
    lines = list(dict.fromkeys(problems))
    with _said_lock:
        before = _said.pop(what, frozenset())
        if lines:
            _said[what] = frozenset(lines)
    for line in lines:
        if line not in before:
            logger.warning("{}", line)


@contextmanager
def warned_while_failing(
    what: str, errors: tuple[type[Exception], ...], failed: str, then: str = ""
) -> Iterator[None]:
    """Run the ``with`` block; a failure is logged once while it lasts, and forgotten once the block works.

    For a step that runs again and again (every rescan, every heartbeat) and must not end its caller: one
    WARNING ``<failed>: <ExceptionType>: <exception>[. <then>]`` when it starts failing (:func:`warn_once` on
    ``what``), none while it keeps failing the same way, and one again once it worked in between. An error
    that says nothing about the path (out of file descriptors: :func:`_failed_line`) is said by what ran out.

    Args:
        what: the subject (one key per kind of step and place: the rescan of one root).
        errors: the exceptions that are the step failing: the rest of the block is skipped, and the caller
            goes on after the ``with``.
        failed: what failed, naming the place (``"hub: roster push to mini failed"``).
        then: what happens now and what to check, when there is something to say ("" for nothing).

    Yields:
        Nothing: the block runs inside.

    Raises:
        Exception: whatever the block raises outside ``errors``, unchanged (the memory is left as it was).
    """
    try:
        yield
    except errors as exc:
        warn_once(what, [_failed_line(failed, exc, then)])
        return  # swallowed: a step that fails must not end its caller
    warn_once(what, [])


def _failed_line(failed: str, exc: Exception, then: str) -> str:
    """Pure: the line :func:`warned_while_failing` logs for ``exc``.

    An error that says nothing about the path (:func:`~hermes_actors.store.os_errors.resource_failure`: out of file
    descriptors, say) is said by what ran out, without its file (the same line while it lasts, whichever file
    the step failed on) and without ``then``, whose advice is about the files.
    """
    short = resource_failure(exc)
    if short is not None:
        return (f"{failed}: {short}: {advised(exc)}. Nothing is taken as moved, removed or swapped meanwhile; "
                "it is tried again while it lasts")
    return f"{failed}: {type(exc).__name__}: {exc}" + (f". {then}" if then else "")


class _Refused(Exception):
    """The file is refused; the message says why (without the path)."""


def _read_capped(path: Path) -> bytes:
    """Read a regular, non-symlink file of at most :data:`MAX_CONFIG_BYTES`.

    Args:
        path: the file to read.

    Returns:
        The bytes.

    Raises:
        FileNotFoundError: when the file does not exist.
        _Refused: a symlink, not a regular file, or too big.
        OSError: when it cannot be opened or read.
    """
    if path.is_symlink():
        raise _Refused("is a symlink")
    try:
        # O_NONBLOCK: a FIFO in the file's place must not hang the open (it is refused as not regular below)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Refused("is a symlink") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _Refused("is not a regular file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise _Refused(f"is too big ({info.st_size} bytes > {MAX_CONFIG_BYTES})")
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise _Refused(f"grew past {MAX_CONFIG_BYTES} bytes while reading")
    return data


def _value_children(node: Any) -> list[Any] | None:
    """The parts of a loaded value (None: a scalar)."""
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    return node if isinstance(node, list) else None


def _node_children(node: Any) -> list[Any] | None:
    """The parts of a composed YAML node (None: a scalar); an alias is the node it names, a merge key its mapping."""
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else None


def expanded_size(
    value: Any, limit: int = MAX_EXPANDED_VALUES, children: Callable[[Any], list[Any] | None] = _value_children
) -> int | None:
    """Pure: how many values ``value`` holds once shared (aliased) parts are counted each time they appear.

    Args:
        value: what a YAML loader returned (dicts, lists, scalars; parts may be shared or recursive),
            or, with ``children=_node_children``, the node graph ``yaml.compose`` returned.
        limit: stop counting past it.
        children: the parts of a container (None for a scalar).

    Returns:
        The count (keys and values, every container and scalar), or None when it is above
        ``limit`` or the structure contains itself (a recursive alias).
    """
    sizes: dict[int, int] = {}  # id → expanded size of a container already counted
    open_ids: set[int] = set()  # containers being counted (a recursive alias comes back to one)
    stack: list[tuple[Any, bool]] = [(value, False)]
    results: list[int] = []
    while stack:
        node, done = stack.pop()
        parts = children(node)
        if parts is None:
            results.append(1)
            continue
        key = id(node)
        if done:
            open_ids.discard(key)
            total = 1 + sum(results[len(results) - len(parts):]) if parts else 1
            del results[len(results) - len(parts):]
            if total > limit:
                return None
            sizes[key] = total
            results.append(total)
            continue
        if key in sizes:
            results.append(sizes[key])
            continue
        if key in open_ids:
            return None
        open_ids.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(parts))
    return results[0]


class _Open:
    """A collection being parsed: how deep the values inside it go so far, and what a mapping's next value is."""

    __slots__ = ("anchor", "height", "is_mapping", "merge_next", "parts")

    def __init__(self, anchor: str | None, is_mapping: bool) -> None:
        self.anchor = anchor
        self.is_mapping = is_mapping
        self.height = 0  # levels of the deepest value inside, once built
        self.parts = 0  # keys and values seen (a mapping's even parts are keys)
        self.merge_next = False  # the last key was ``<<``: the next value's contents land at this level

    def add(self, height: int, kind: str, merge_key: bool) -> int:
        """Count a finished part of ``height`` levels (``kind``: scalar, mapping, sequence); returns its height here."""
        is_value = self.is_mapping and self.parts % 2 == 1
        self.parts += 1
        if is_value and self.merge_next:  # ``<<: *a`` or ``<<: [*a, *b]``: their entries, not them, are here
            self.merge_next = False
            height = max(0, height - (2 if kind == "sequence" else 1))
        elif self.is_mapping and not is_value:
            self.merge_next = merge_key
        self.height = max(self.height, height)
        return height


def too_deep(text: str, limit: int = MAX_NESTING) -> bool:
    """Whether YAML ``text`` nests collections more than ``limit`` deep, its aliases expanded.

    Read from the parser's events, which libyaml produces without recursing, so it is
    safe to ask before anything recursive (the composer) sees the document; it stops
    at the first level too deep. An alias counts as deep as the collection it names
    (a chain of aliases, each a few levels deeper, nests deep in a small file), and a
    merge (``<<: *a``) as the entries it adds (what a merge's list, ``<<: [*a, *b]``,
    names is checked where it is written: up to two levels more than it adds); a
    recursive alias counts as nothing here (:func:`expanded_size` refuses it).

    Args:
        text: the YAML document.
        limit: the deepest nesting accepted (a top-level mapping is 1).

    Returns:
        True when some value is more than ``limit`` collections deep.

    Raises:
        yaml.YAMLError: malformed YAML (up to the point read).
    """
    heights: dict[str, tuple[int, str]] = {}  # anchor → the levels and kind of what it names
    stack: list[_Open] = []
    for event in yaml.parse(text, Loader=_SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= limit:
                return True
            stack.append(_Open(event.anchor, isinstance(event, yaml.MappingStartEvent)))
            continue
        merge_key = False
        if isinstance(event, yaml.CollectionEndEvent):
            done = stack.pop()
            height, kind = done.height + 1, "mapping" if done.is_mapping else "sequence"
            if done.anchor is not None:
                heights[done.anchor] = (height, kind)
        elif isinstance(event, yaml.AliasEvent):
            height, kind = heights.get(event.anchor or "", (0, "scalar"))
        elif isinstance(event, yaml.ScalarEvent):
            height, kind = 0, "scalar"
            merge_key = event.value == "<<" and event.tag is None and event.implicit[0]
            if event.anchor is not None:
                heights[event.anchor] = (0, "scalar")
        else:
            continue
        if stack and len(stack) + stack[-1].add(height, kind, merge_key) > limit:
            return True
    return False


# A block scalar's header (``key: |-  # note``): its comment is inside the scalar's token, not between tokens.
_BLOCK_HEADER_COMMENT = re.compile(r"[|>][-+0-9]*[ \t]+#")


def comment_lines(text: str) -> list[int]:
    """Pure: the lines of YAML ``text`` that hold a comment, whole-line or at a line's end, as YAML reads them.

    A ``#`` starts a comment where the YAML scanner skips it: between tokens (so after whitespace or at a
    line's start), never inside a scalar: ``"a # b"``, ``'a # b'``, ``a#b`` (a URL's fragment) and the lines of
    a block scalar (``|``, ``>``) are text; a block scalar's header may carry one (``key: |  # note``).
    Read from PyYAML's scanner (its tokens and their positions), which has no comment token of its own.

    Args:
        text: the YAML document.

    Returns:
        The 1-based numbers of the lines holding a comment, in order; for text the scanner refuses (malformed
        YAML), every line holding a ``#`` (a rewrite must not drop one unseen).
    """
    starts: list[int] = []
    covered = 0  # the text before this is read: tokens, and the gaps between them already searched
    try:
        for token in yaml.scan(text, Loader=_SafeLoader):
            begin, end = token.start_mark.index, token.end_mark.index
            if begin > covered:
                starts += _gap_comments(text, covered, begin)
            if isinstance(token, yaml.ScalarToken) and token.style in ("|", ">"):
                header = _BLOCK_HEADER_COMMENT.match(text, begin, end)
                if header is not None:
                    starts.append(header.end() - 1)
            covered = max(covered, end)
    except yaml.YAMLError:
        return [n for n, line in enumerate(text.splitlines(), 1) if "#" in line]
    starts += _gap_comments(text, covered, len(text))
    breaks = [at for at, char in enumerate(text) if char == "\n"]
    return sorted({bisect.bisect_left(breaks, at) + 1 for at in starts})


def _gap_comments(text: str, begin: int, end: int) -> list[int]:
    """Pure: where the comments start in ``text[begin:end]``, a stretch between tokens (whitespace, line breaks,
    comments: a comment runs to its line's end)."""
    found: list[int] = []
    at = text.find("#", begin, end)
    while at != -1:
        found.append(at)
        line_end = text.find("\n", at, end)
        if line_end == -1:
            break
        at = text.find("#", line_end, end)
    return found


def read_yaml_mapping(path: Path) -> tuple[dict[str, Any], str | None]:
    """Read a YAML mapping without logging.

    Args:
        path: the YAML file.

    Returns:
        ``(mapping, None)``; ``({}, None)`` when the file is missing or empty;
        ``({}, problem)`` when it is a symlink, larger than 1 MiB, unreadable,
        malformed, not a mapping, nested more than :data:`MAX_NESTING` levels deep, or holds more than
        :data:`MAX_EXPANDED_VALUES` values once its aliases are expanded (or a recursive one) —
        ``problem`` is one line naming the file.

    Raises:
        OSError: the file could not be read for a reason that says nothing about it (out of file descriptors,
            say: :func:`~hermes_actors.store.os_errors.resource_failure`): read as empty, a profile would look
            unmanaged and a config.yaml's settings would be dropped, for a failure that passes.
    """
    path = Path(path)
    try:
        data = _read_capped(path)
    except FileNotFoundError:
        return {}, None
    except _Refused as exc:
        return {}, f"config file {path} {exc}; ignoring it"
    except OSError as exc:
        if resource_failure(exc):
            raise
        return {}, f"config file {path} is unreadable ({exc}); ignoring it"
    try:
        loaded, refusal = load_bounded(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return {}, f"config file {path} is not valid UTF-8 ({exc}); ignoring it"
    except yaml.YAMLError as exc:
        return {}, f"config file {path} is malformed YAML ({exc}); ignoring it"
    if refusal is not None:
        return {}, f"config file {path} {refusal}; ignoring it"
    if loaded is None:
        return {}, None
    if not isinstance(loaded, dict):
        return {}, f"config file {path} top level is a {type(loaded).__name__}, not a mapping; ignoring it"
    return loaded, None


def load_bounded(text: str) -> tuple[Any, str | None]:
    """Parse YAML ``text`` with a safe loader, checking its depth and expanded size before building anything.

    The nesting is checked first, from the parser's events (:func:`too_deep`): libyaml's
    composer recurses once per level and crashes the process on a deep enough document,
    and whatever walks the result (``copy.deepcopy``) raises RecursionError long before.
    Building is where aliases and merge keys (``<<: *a``) are expanded: nested aliases
    ("billion laughs") or chained merges cost memory and time there, so the node graph
    is counted (:func:`expanded_size`) and a document over the limit is never built.

    Returns:
        ``(value, None)``; ``(None, why)`` when the document is refused — ``why`` completes
        "the file …": nested more than :data:`MAX_NESTING` levels deep, over
        :data:`MAX_EXPANDED_VALUES` values expanded, or recursive.

    Raises:
        yaml.YAMLError: malformed YAML.
    """
    if too_deep(text):
        return None, f"nests more than {MAX_NESTING} levels of lists or mappings (aliases expanded)"
    loader = _SafeLoader(text)  # the C loader when present
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        if expanded_size(node, children=_node_children) is None:
            return None, (f"holds more than {MAX_EXPANDED_VALUES} values once its YAML aliases are expanded, "
                          "or an alias that contains itself")
        return loader.construct_document(node), None
    finally:
        loader.dispose()


def load_yaml_file(path: Path) -> dict[str, Any]:
    """Load a YAML mapping, tolerating every kind of bad file.

    Args:
        path: the YAML file.

    Returns:
        The top-level mapping; ``{}`` when the file is missing or empty, and
        ``{}`` plus a warning naming the file and the problem when it is a
        symlink, larger than 1 MiB, unreadable, malformed, or not a mapping
        (said once while the problem lasts, however often the file is read).

    Raises:
        OSError: out of file descriptors, say (:func:`read_yaml_mapping`).
    """
    mapping, problem = read_yaml_mapping(path)
    warn_once(str(path), [problem] if problem is not None else [])
    return mapping
