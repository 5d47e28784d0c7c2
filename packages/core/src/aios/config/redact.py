"""Redaction: the one place that decides what is a secret and hides it (keys that name a
secret, passwords in URLs, signed-URL parameters, secret flags on a command line).

Everything aios prints or records goes through it: errors (:mod:`aios.errors`), run records,
the resolved config, dry runs. It imports nothing from aios, so any module may use it.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["SECRET_WORDS", "is_secret", "redact", "redact_argv", "redact_url"]

#: name parts (split at ``_``/``-``/``.``/camelCase, case-insensitive) that make a key secret
SECRET_WORDS = frozenset(
    {
        "KEY",
        "KEYS",
        "APIKEY",
        "ACCESSKEY",
        "SECRETKEY",
        "PRIVATEKEY",
        "TOKEN",
        "TOKENS",
        "AUTHTOKEN",
        "ACCESSTOKEN",
        "SECRET",
        "SECRETS",
        "PASSWORD",
        "PASSWORDS",
        "PASSWD",
        "PASS",
        "PASSPHRASE",
        "PWD",
        "CREDENTIAL",
        "CREDENTIALS",
        "CREDS",
        "PAT",
        "COOKIE",
        "COOKIES",
        "SESSION",
        "SESSIONID",
        "AUTH",
        "OAUTH",
        "AUTHORIZATION",
        "BEARER",
        "DSN",
        "SIGNATURE",
        "SAS",
    }
)
#: ``*_URL``/``*_URI`` names of data stores: their values usually embed credentials
_STORE_WORDS = frozenset(
    {
        "DATABASE",
        "DB",
        "REDIS",
        "MONGO",
        "MONGODB",
        "POSTGRES",
        "POSTGRESQL",
        "PG",
        "MYSQL",
        "AMQP",
        "RABBITMQ",
        "BROKER",
        "CELERY",
        "SQLALCHEMY",
        "CONNECTION",
        "CONN",
    }
)
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})  # the shell's working directories
#: unambiguous enough to count inside a longer part (``PGPASSWORD``, ``MYAPIKEY``)
_SECRET_INFIXES = (
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "SECRET",
    "CREDENTIAL",
    "APIKEY",
    "PRIVATEKEY",
)
_NAME_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_URL_CREDENTIALS = re.compile(
    r"(?P<pre>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<pw>[^/\s@]+)(?P<at>@)"
)


def _name_parts(key: str) -> list[str]:
    return [m.upper() for m in _NAME_PARTS.findall(key)]


def is_secret(key: str) -> bool:
    """Whether a key (env var, config key, CLI flag name) names a secret. Whole name parts count,
    not substrings: ``DB_PASS``, ``GITHUB_PAT``, ``apiKey``, ``SESSION_ID``, ``DATABASE_URL``
    are secret; ``MONKEY_NAME`` and ``tokenizer`` are not."""
    if key.upper() in _NOT_SECRET:
        return False
    parts = _name_parts(key)
    if any(p in SECRET_WORDS or any(w in p for w in _SECRET_INFIXES) for p in parts):
        return True
    return bool({"URL", "URI"} & set(parts)) and bool(_STORE_WORDS & set(parts))


#: query parameters of signed URLs (GCS V4 and V2, AWS SigV4, Azure SAS) and other credentials
_URL_SECRET_PARAMS = re.compile(
    r"(?i)(?P<pre>[?&;](?:x-goog-signature|x-goog-credential|x-amz-signature|x-amz-credential|"
    r"x-amz-security-token|signature|sig|googleaccessid|awsaccesskeyid|token|access_token|"
    r"key|api_key|apikey|password|secret|client_secret)=)(?P<val>[^&;#\s'\"]+)"
)


def redact_url(value: str) -> str:
    """A text with the secrets of the URLs in it replaced by ``***``: the password of user info
    (``scheme://user:***@host``) and signed-URL query parameters (``X-Goog-Signature=***``,
    ``X-Amz-Credential=***``, ``sig=***`` ...). The one function everything aios prints or
    records goes through (run records, errors, the closing lines, resume messages)."""
    if "://" not in value and "=" not in value:
        return value
    value = _URL_CREDENTIALS.sub(lambda m: f"{m.group('pre')}***{m.group('at')}", value)
    return _URL_SECRET_PARAMS.sub(lambda m: f"{m.group('pre')}***", value)


def redact(obj: Any) -> Any:
    """Replace values under secret-looking keys with '***' (recursively), and passwords inside
    URLs anywhere."""
    if isinstance(obj, dict):
        return {
            k: ("***" if is_secret(str(k)) and v not in (None, "") else redact(v))
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_url(obj)
    return obj


_ARG_KEY = re.compile(r"^(?P<dash>-{0,2})(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*)=(?P<value>.*)$", re.S)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with secrets replaced by ``***``: ``--token=x``, ``--token x``,
    ``KEY=value`` and ``a.b.api_key=value`` forms, and passwords inside URLs."""
    out: list[str] = []
    hide_next = False
    for i, arg in enumerate(argv):
        if hide_next and not arg.startswith("-"):
            out.append("***")
            hide_next = False
            continue
        hide_next = False
        m = _ARG_KEY.match(arg) if i else None
        if m and is_secret(m.group("key").rsplit(".", 1)[-1]) or m and is_secret(m.group("key")):
            out.append(f"{m.group('dash')}{m.group('key')}=***")
            continue
        if i and arg.startswith("-") and "=" not in arg and is_secret(arg.lstrip("-")):
            hide_next = True
        out.append(redact_url(arg))
    return out
