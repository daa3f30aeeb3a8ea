"""JSON text for the hot paths (ledger details, message bodies), from encoders and a decoder built once.

``json.dumps`` and ``JSONEncoder.encode`` build a new C encoder on every call, which costs about
as much as encoding a small object: a Kafka worker encodes six objects per record, and that
construction was 8 % of its CPU (py-spy, 2026-11-30). The standard library's C encoder is built
once here and called directly; without it (another interpreter) the public encoder is used. Both
functions write exactly what ``json.dumps`` writes with the same options.

``loads`` reads a message body as ``json.loads`` does, through the C scanner alone when the body is
UTF-8 JSON with nothing around the value (what every producer here writes): ``json.loads`` on bytes
first guesses their encoding and then matches whitespace around the value with regular expressions,
2.7 us for a small Kafka body against 0.8. Anything else goes to ``json.loads``, which decides it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _encoder
from typing import Any, cast

Encode = Callable[[Any], str]


def _built(*, sort_keys: bool, default: Callable[[Any], Any]) -> Encode:
    public = json.JSONEncoder(sort_keys=sort_keys, default=default, check_circular=False).encode
    make = getattr(_encoder, "c_make_encoder", None)
    if make is None:
        return public
    try:
        # The arguments JSONEncoder.iterencode passes (markers None: no circular check, as
        # check_circular=False; the objects written here are built by the harness and its handlers).
        c = make(None, default, _encoder.encode_basestring_ascii, None, ": ", ", ", sort_keys, False, True)
    except TypeError:  # a C encoder of another signature
        return public

    def encode(obj: Any) -> str:
        return "".join(c(obj, 0))

    probe = {"b": [1, 2.5, None, True], "a": "é"}
    return encode if encode(probe) == public(probe) else public


# the decoder's own scanner (C when built), an attribute each JSONDecoder sets in __init__
_scan = cast("Callable[[str, int], tuple[Any, int]]", vars(json.JSONDecoder())["scan_once"])


def loads(data: bytes | str) -> Any:
    """Return ``json.loads(data)``: the same value, or the same error."""
    try:
        text = data.decode() if isinstance(data, bytes) else data
        value, end = _scan(text, 0)
    except (StopIteration, UnicodeDecodeError, json.JSONDecodeError):
        return json.loads(data)  # whitespace first, another encoding, or not JSON: its own answer
    if end != len(text):
        return json.loads(data)  # something after the value: whitespace, or an error to raise
    return value


# json.dumps(obj): another object is refused with the public encoder's own TypeError
dumps: Encode = _built(sort_keys=False, default=json.JSONEncoder().default)
dumps_sorted: Encode = _built(sort_keys=True, default=str)  # json.dumps(obj, sort_keys=True, default=str)
