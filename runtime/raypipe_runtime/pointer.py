"""RFC 6901 JSON Pointers, exactly as raypipe's Rust side reads them (src/graph/pointer.rs).

"" is the whole value; each "/segment" selects an object member, or an array element by a
decimal index without leading zeros ("-" never resolves); "~1" is "/", "~0" is "~". Anything
else does not resolve. Used by edge `select` / `into`, split `sticky_key` and predicate paths.
"""

from __future__ import annotations

MAX_POINTER_LEN = 256

_MISSING = object()


class PointerError(ValueError):
    """A malformed pointer."""


class RawBodyError(Exception):
    """A pointer tried to look inside a request body that is not JSON."""


class RawBody(str):
    """A request body that is not JSON (kept as text). Passing it on whole works; reading a
    member of it (a predicate path, a `select`, a sticky key) is an INVALID_INPUT error."""


def check(pointer: str) -> None:
    """Raises PointerError unless `pointer` is well formed ("" is valid)."""
    if not isinstance(pointer, str):
        raise PointerError("a JSON Pointer must be a string")
    if len(pointer) > MAX_POINTER_LEN:
        raise PointerError(f"longer than {MAX_POINTER_LEN} characters ({len(pointer)})")
    if pointer == "":
        return
    if not pointer.startswith("/"):
        raise PointerError("a JSON Pointer is empty or starts with '/'")
    for i, ch in enumerate(pointer):
        if ch == "~" and pointer[i + 1 : i + 2] not in ("0", "1"):
            raise PointerError(f"'~' at position {i} must be followed by '0' or '1'")


def segments(pointer: str) -> list[str]:
    """The unescaped segments of a well-formed pointer ("" has none)."""
    if pointer == "":
        return []
    return [s.replace("~1", "/").replace("~0", "~") for s in pointer.split("/")[1:]]


def escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")


def _index(segment: str):
    if not segment or not segment.isascii() or not segment.isdigit():
        return None
    if len(segment) > 1 and segment[0] == "0":
        return None
    return int(segment)


def resolve(value, pointer: str, default=None, *, strict_raw: bool = True):
    """The value at `pointer`, or `default` when it does not resolve. Looking inside a RawBody
    raises RawBodyError (unless strict_raw is False, then it does not resolve)."""
    found = lookup(value, pointer, strict_raw=strict_raw)
    return default if found is _MISSING else found


def lookup(value, pointer: str, *, strict_raw: bool = True):
    """Like resolve, but returns the sentinel MISSING when the pointer does not resolve."""
    try:
        check(pointer)
    except PointerError:
        return _MISSING
    current = value
    for segment in segments(pointer):
        if isinstance(current, RawBody):
            if strict_raw:
                raise RawBodyError(pointer)
            return _MISSING
        if isinstance(current, dict):
            if segment not in current:
                return _MISSING
            current = current[segment]
        elif isinstance(current, list):
            index = _index(segment)
            if index is None or index >= len(current):
                return _MISSING
            current = current[index]
        else:
            return _MISSING
    return current


MISSING = _MISSING


def exists(value, pointer: str) -> bool:
    return lookup(value, pointer) is not _MISSING


def write(document, pointer: str, value):
    """Writes `value` at `pointer` inside `document`, creating intermediate objects, and
    returns the (possibly new) document. "" replaces the whole document. A segment that meets
    an array sets (or with "-" or len, appends) an element; meeting a scalar is a ValueError."""
    parts = segments(pointer)
    if not parts:
        return value
    if document is None:
        document = {}
    if not isinstance(document, (dict, list)):
        raise ValueError(f"cannot write {pointer!r}: the document is not an object")
    current = document
    for i, segment in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(current, dict):
            if last:
                current[segment] = value
                break
            nxt = current.get(segment)
            if nxt is None:
                nxt = {}
                current[segment] = nxt
            elif not isinstance(nxt, (dict, list)):
                where = "/".join(escape(p) for p in parts[: i + 1])
                raise ValueError(f"cannot write {pointer!r}: /{where} is not an object")
            current = nxt
        else:  # list
            index = len(current) if segment == "-" else _index(segment)
            if index is None or index > len(current):
                raise ValueError(f"cannot write {pointer!r}: {segment!r} is not an index of the array")
            if last:
                if index == len(current):
                    current.append(value)
                else:
                    current[index] = value
                break
            if index == len(current):
                current.append({})
            nxt = current[index]
            if nxt is None:
                nxt = {}
                current[index] = nxt
            elif not isinstance(nxt, (dict, list)):
                raise ValueError(f"cannot write {pointer!r}: element {index} is not an object")
            current = nxt
    return document
