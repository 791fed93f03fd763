"""Redact credentials by their value, wherever they sit in a recorded string.

One function, ``redact_text``, used where values are recorded (runner: env.json, campaign.json's
launch command, status.json's cause) and again where they are read (ingest: env.json,
campaign.json, status.json, third-party env records), so campaigns written before it are
redacted too. Names are judged elsewhere (runner.env drops ``*TOKEN*``/``*KEY*`` variables); this
module judges the value, because a variable kept for its prefix (``TORCH_HUB_URL``,
``NCCL_IB_HCA``) carries whatever the user put in it.

What is redacted (each match becomes ``<redacted>``):

- URL userinfo with a password: ``scheme://user:password@host`` -> ``scheme://<redacted>@host``
  (a bare ``scheme://user@host`` is kept unless the user part is itself a token below);
- known token shapes: Hugging Face ``hf_``, GitHub ``ghp_/gho_/ghu_/ghs_/ghr_`` and
  ``github_pat_``, OpenAI/Anthropic-style ``sk-``, Slack ``xox[abprs]-``, each followed by >= 16
  token characters; AWS access key ids ``AKIA``/``ASIA`` + 16 upper-case letters or digits;
- HTTP credentials: an ``Authorization:``/``Proxy-Authorization:`` header's whole value (also
  ``"authorization": "..."`` and ``HTTP_AUTHORIZATION=...``) -> ``Authorization: <redacted>``; ``Bearer`` + >= 16 token characters -> ``Bearer <redacted>``;
  ``Basic`` + >= 8 base64 characters with a digit, ``+``, ``/``, ``=`` or an inner upper-case
  letter (a base64 credential, not an English word) -> ``Basic <redacted>``; whatever their case;
- a secret by its key: ``token=``, ``access_token=``, ``api_key:``, ``password=``, ``secret=``,
  ``auth=``, ``HF_TOKEN=`` ... (a key ending in token, secret, password, passwd, api key, access
  key, private key, auth or credential(s), ``=`` or ``:``) followed by >= 6 characters up to a
  space, ``&``, ``;``, ``,`` or a quote: the value becomes ``<redacted>``, the key is kept;
- AWS secret-key shape: exactly 40 characters of ``[A-Za-z0-9/+]`` standing alone, starting with
  a letter or digit, random-looking (below) with entropy >= 4.3 bits per character;
- long random-looking tokens: a run of >= 24 characters of ``[A-Za-z0-9+-]`` (a path's ``/``,
  a hostname's or version's ``.``, an identifier's ``_`` and ``=`` end a run) that is
  random-looking: an upper-case letter, a lower-case letter and a digit, Shannon entropy >= 3.8
  bits per character, less than 60% of its characters in letter words (``[A-Z]?[a-z]{3,}``:
  ``Checkpoint``, ``Megatron``, ``native``), not hex with dashes (UUIDs, ``GPU-<uuid>``) and
  not inside a mangled C++ symbol (a word starting ``_Z``: kernel names). Measured on random base62 tokens (tests/test_redact.py): 32 and 40
  characters are caught 98%, 24 characters 95%, ``secrets.token_urlsafe(32)`` 88% (its ``_``
  splits it); the name rule and the shapes above are the first line.

Deliberately kept: paths, hostnames, version strings (short runs between ``/`` and ``.``),
hex commit ids and UUIDs (no upper-case letter), identifiers of words (low entropy). A hex-only
or all-lower-case secret standing alone is not recognised by value; its variable name, its key
(``token=``) or its scheme (``Bearer``) must give it away.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

REDACTED = "<redacted>"
MIN_ENTROPY_BITS = 3.8  # per character; random base62 of 24+ characters is above it 95%+ of the time
AWS_MIN_ENTROPY_BITS = 4.3  # 40 random base64 characters: >= 4.32 in 5,000 draws
MAX_WORD_FRACTION = 0.6
MIN_TOKEN_CHARS = 24

_URL_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@:]*:[^/\s@]*)@")
_KNOWN = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,}"
    r"|sk-[A-Za-z0-9_-]{16,}|xox[abprs]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[A-Z0-9]{16})(?![A-Za-z0-9])")
_AUTH_HEADER = re.compile(r"(?i)(?<![A-Za-z0-9])(?P<key>(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)(?!<redacted>)[^\s\"'][^\r\n\"']*")
_BEARER = re.compile(r"(?i)(?<![A-Za-z0-9])(?P<key>bearer\s+)[A-Za-z0-9._~+/-]{16,}=*(?![A-Za-z0-9._~+/=-])")
_BASIC = re.compile(r"(?i)(?<![A-Za-z0-9])(?P<key>basic\s+)(?P<cred>[A-Za-z0-9+/]{8,}=*)(?![A-Za-z0-9+/=])")
_SECRET_KEY = re.compile(
    r"(?i)(?<![A-Za-z0-9_])(?P<key>(?:[A-Za-z0-9]+[_-])*(?:token|secret|password|passwd|api[_-]?key|access[_-]?key"
    r"|private[_-]?key|auth|credentials?)\s*[=:]\s*[\"']?)(?!<redacted>)[^\s&;,\"'<>]{6,}")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+._-])[A-Za-z0-9][A-Za-z0-9/+]{39}(?![A-Za-z0-9/+=._-])")
_TOKEN = re.compile(r"[A-Za-z0-9+-]{%d,}" % MIN_TOKEN_CHARS)
_WORD = re.compile(r"[A-Z]?[a-z]{3,}")
_HEX_WITH_DASHES = re.compile(r"[A-Za-z]*-?[0-9a-fA-F-]+")


def entropy_bits(text: str) -> float:
    """Shannon entropy of ``text``'s characters, bits per character (0 for '')."""
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values()) if n else 0.0


def _random_looking(token: str, *, min_entropy_bits: float = MIN_ENTROPY_BITS) -> bool:
    """Upper, lower and digit present, entropy high, few letter words, not hex with dashes."""
    return (any(c.isupper() for c in token) and any(c.islower() for c in token) and any(c.isdigit() for c in token)
            and entropy_bits(token) >= min_entropy_bits
            and sum(map(len, _WORD.findall(token))) < MAX_WORD_FRACTION * len(token)
            and not _HEX_WITH_DASHES.fullmatch(token))


def _redact_if_random(m: re.Match) -> str:
    word_start = max(m.string.rfind(c, 0, m.start()) for c in " \t\n\"'(,;") + 1
    if m.string.startswith("_Z", word_start):  # a mangled C++ symbol (a kernel's name): length-prefixed words
        return m.group(0)
    return REDACTED if _random_looking(m.group(0)) else m.group(0)


def _redact_basic(m: re.Match) -> str:
    cred = m.group("cred")
    encoded = any(c.isdigit() or c in "+/=" for c in cred) or any(c.isupper() for c in cred[1:])
    return m.group("key") + REDACTED if encoded else m.group(0)


def _redact_if_aws_secret(m: re.Match) -> str:
    return REDACTED if _random_looking(m.group(0), min_entropy_bits=AWS_MIN_ENTROPY_BITS) else m.group(0)


def redact_text(text: str) -> str:
    """``text`` with every credential-shaped part (module docstring) replaced by ``<redacted>``.
    Pure; the same string back (same object) when nothing matched."""
    if len(text) < 11:  # shorter than any shape above (the shortest: auth=xxxxxx)
        return text
    out = _URL_PASSWORD.sub(lambda m: m.group("scheme") + REDACTED + "@", text)
    out = _KNOWN.sub(REDACTED, out)
    out = _AUTH_HEADER.sub(lambda m: m.group("key") + REDACTED, out)
    out = _BEARER.sub(lambda m: m.group("key") + REDACTED, out)
    out = _BASIC.sub(_redact_basic, out)
    out = _SECRET_KEY.sub(lambda m: m.group("key") + REDACTED, out)
    out = _AWS_SECRET.sub(_redact_if_aws_secret, out)
    out = _TOKEN.sub(_redact_if_random, out)
    return text if out == text else out


MAX_DEPTH = 100  # deeper than any record of ours; a subtree below it is replaced whole


def redact_value(value: Any, *, _depth: int = 0) -> Any:
    """``value`` with ``redact_text`` applied to every string in it (dict values, list and tuple
    items, recursively; dict keys are names and kept). Other types come back unchanged; a
    container nested deeper than MAX_DEPTH becomes ``<redacted>`` (never a RecursionError)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, (dict, list, tuple)) and _depth >= MAX_DEPTH:
        return REDACTED
    if isinstance(value, dict):
        return {k: redact_value(v, _depth=_depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v, _depth=_depth + 1) for v in value)
    return value
