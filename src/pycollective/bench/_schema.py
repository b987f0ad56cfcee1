"""The ``--json`` format: its version, its JSON Schema and a small validator.

``schema.json`` (beside this module) describes what ``--json`` writes, for
every command.  :data:`SCHEMA_VERSION` is written into every file and goes
up whenever a field changes meaning or disappears (new fields do not change
it).  :func:`validate` checks a document against the schema with the
subset of JSON Schema (draft 2020-12) that ``schema.json`` uses, so that
reading the format needs no third-party package; a keyword outside that
subset is an error, never silently ignored.
"""

import json
from importlib import resources

__all__ = ["SCHEMA_VERSION", "load_schema", "validate", "KEYWORDS"]

SCHEMA_VERSION = 1

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}

# Keywords that only describe and never constrain.
_ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "$defs", "default",
                "examples"}
#: Every keyword :func:`validate` understands.
KEYWORDS = _ANNOTATIONS | {"type", "enum", "const", "properties", "required",
                           "additionalProperties", "items", "minimum", "allOf", "oneOf", "anyOf",
                           "$ref"}


def load_schema() -> dict:
    """The JSON Schema of the ``--json`` output (``pycollective/bench/schema.json``)."""
    return json.loads(resources.files(__package__).joinpath("schema.json").read_text())


def validate(document, schema=None) -> list:
    """Check ``document`` against ``schema`` (default :func:`load_schema`).

    Returns:
        A list of problems, each ``"<path>: <what>"``; empty when valid.

    Raises:
        ValueError: the schema uses a keyword this validator does not know.
    """
    root = load_schema() if schema is None else schema
    problems = []
    _check(document, root, root, "$", problems)
    return problems


def _resolve(root, ref):
    if not ref.startswith("#/"):
        raise ValueError(f"only local references are supported, got {ref!r}")
    node = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _check(value, schema, root, path, problems):
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise ValueError(f"schema at {path} uses unsupported keywords {sorted(unknown)}")
    if "$ref" in schema:
        _check(value, _resolve(root, schema["$ref"]), root, path, problems)
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[k](value) for k in kinds):
            problems.append(f"{path}: expected {' or '.join(kinds)}, got {type(value).__name__}")
            return
    if "const" in schema and value != schema["const"]:
        problems.append(f"{path}: expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and _TYPES["number"](value) and value < schema["minimum"]:
        problems.append(f"{path}: {value!r} is below the minimum {schema['minimum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{path}: missing {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                _check(item, props[key], root, f"{path}.{key}", problems)
            elif extra is False:
                problems.append(f"{path}: unexpected {key!r}")
            elif isinstance(extra, dict):
                _check(item, extra, root, f"{path}.{key}", problems)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], root, f"{path}[{i}]", problems)
    for branch in schema.get("allOf", []):
        _check(value, branch, root, path, problems)
    for word, want in (("oneOf", lambda n: n == 1), ("anyOf", lambda n: n >= 1)):
        if word in schema:
            results = []
            for branch in schema[word]:
                found = []
                _check(value, branch, root, path, found)
                results.append(found)
            if not want(sum(not r for r in results)):
                problems.append(f"{path}: matches {sum(not r for r in results)} of the "
                                f"{word} alternatives" + ("; the closest one says:"
                                                         if any(results) else ""))
                problems.extend(min((r for r in results if r), key=len, default=[]))
