"""Secret redaction for everything that leaves the node: logs, launch commands, env.

Three entry points, all pure and total (they never raise on odd input):

- :func:`redact_text` masks inline secrets in free text: ``NAME=value`` / ``name: value``
  / ``--flag value`` where NAME looks like a secret, ``Bearer``/``Basic`` credentials,
  ``user:password@`` in URLs, and well-known token shapes (``hf_...``, ``sk-...``,
  ``ghp_...``, ``xox?-...``, ``AKIA...``).
- :func:`redact_argv` masks the value of secret-looking flags (``--api-key X``,
  ``--hf-token=X``) and applies :func:`redact_text` to every element.
- :func:`redact_env` masks the value of secret-looking variables (``HF_TOKEN``,
  ``AWS_SECRET_ACCESS_KEY``...) and applies :func:`redact_text` to the others
  (credentials inside URLs such as ``MLFLOW_TRACKING_URI``).

A name "looks like a secret" when one of its words (split on ``-``, ``_``, ``.`` and
camelCase) is in :data:`SECRET_WORDS`, or it is one of :data:`SECRET_NAMES`. Words, not
substrings: ``--max-total-tokens`` and ``--tokenizer-path`` are not secrets, ``HF_TOKEN``
and ``--api-key`` are.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "SECRET_WORDS", "SECRET_NAMES", "is_secret_name", "redact_text", "redact_argv", "redact_env"]

MASK = "***"

#: Words that make a flag / variable name secret (matched against whole words of the name).
SECRET_WORDS = frozenset({
    "token", "key", "apikey", "secret", "secrets", "password", "passwd", "pwd", "pass", "passphrase",
    "auth", "authorization", "oauth", "credential", "credentials", "cred", "creds", "cookie",
    "session", "jwt", "bearer", "privatekey", "signature", "sig",
})
#: Whole names that are secrets although no single word says so.
SECRET_NAMES = frozenset({"hf_token", "hugging_face_hub_token", "huggingface_token", "wandb_api_key", "pgpassword"})
#: Words that, as the *last* word, mean "a count/size/path of X" rather than X itself
#: (``--max-total-tokens`` is plural; ``key_path`` names a file, not a key).
_NOT_SECRET_TAIL = frozenset({"path", "file", "dir", "name", "id", "size", "len", "length", "count", "num",
                              "type", "mode", "format", "dtype", "level", "enabled", "enable", "disable", "map",
                              "usage", "limit", "ttl", "timeout", "error", "errors", "exception",
                              "warning", "warn", "info", "failed", "failure"})

_WORD_SPLIT = re.compile(r"[-_.\s]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret_name(name: str) -> bool:
    """True when a flag or variable name looks like it holds a secret.

    Args:
        name: e.g. ``"--api-key"``, ``"HF_TOKEN"``, ``"apiKey"``, ``"max_total_tokens"``.
    Returns:
        True for ``--api-key``, ``HF_TOKEN``, ``DB_PASSWORD``, ``secretKey``; False for
        ``--max-total-tokens``, ``--tokenizer-path``, ``--speculative-eagle-topk``.
    """
    n = name.strip().lstrip("-").strip("'\"")
    if not n:
        return False
    if n.lower() in SECRET_NAMES:
        return True
    words = [w.lower() for w in _WORD_SPLIT.split(n) if w]
    if not words or words[-1] in _NOT_SECRET_TAIL:
        return False
    return any(w in SECRET_WORDS for w in words)


# Value of an assignment: quoted string, or a run without whitespace/separators.
_VALUE = r"""(?:"[^"\n]*"|'[^'\n]*'|[^\s,;)'"}\]]+)"""
# NAME=value, NAME: value, "name": "value", --flag=value. The name must not follow '#' or a
# word character (SGLang's "#new-token: 16384" is a count, not a secret).
_ASSIGN = re.compile(
    r"""(?P<pre>(?<![#\w-])(?P<q>["']?)(?P<name>-{0,2}[A-Za-z][\w.-]*)(?P=q))"""
    # the value is never itself the start of another assignment ("A= HF_TOKEN=x": the match
    # must be HF_TOKEN=x, not A= swallowing HF_TOKEN)
    r"""(?P<sep>\s*=\s*|\s*:\s+|:(?=["']))(?P<val>(?![A-Za-z][\w.-]*=)""" + _VALUE + r")")
# --flag value (a command line inside text); the value must not itself be a flag.
_FLAG_SPACE = re.compile(r"(?P<pre>(?<![\w-])(?P<name>--[A-Za-z][\w-]*))(?P<sep>[ \t]+)(?P<val>(?!-)" + _VALUE + r")")
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{6,}"), r"\1 " + MASK),
    (re.compile(r"(?<=://)([^/\s:@]+):[^@\s/]+@"), r"\1:" + MASK + "@"),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}\b"), MASK),
    (re.compile(r"(?<![\w-])sk-[A-Za-z0-9_-]{16,}"), MASK),
    (re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}\b|\bgithub_pat_[A-Za-z0-9_]{20,}\b"), MASK),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"), MASK),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\b"), MASK),  # JWT
)


def _assign_sub(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name")):
        return m.group(0)
    val = m.group("val")
    if val in (MASK, "Bearer", "Basic", "Token"):  # already masked by a token pattern
        return m.group(0)
    q = val[0] if val[:1] in ("'", '"') and val[-1:] == val[:1] and len(val) >= 2 else ""
    return f"{m.group('pre')}{m.group('sep')}{q}{MASK}{q}"


def redact_text(s: str) -> str:
    """Mask inline secrets in free text (logs, commands, error messages).

    Args:
        s: any text; non-str input is converted with ``str``.
    Returns:
        The text with secret values replaced by ``***``; names and layout are kept
        (``HF_TOKEN=***``, ``Authorization: Bearer ***``, ``postgresql://u:***@h/db``).
    """
    s = s if isinstance(s, str) else str(s)
    for pat, repl in _PATTERNS:
        s = pat.sub(repl, s)
    s = _ASSIGN.sub(_assign_sub, s)
    return _FLAG_SPACE.sub(_assign_sub, s)


def redact_argv(argv: list[str]) -> list[str]:
    """Mask secret flag values in an argv list (a new list; the input is not modified).

    ``--api-key X`` -> ``--api-key ***``; ``--hf-token=X`` -> ``--hf-token=***``; a
    following element that is itself a flag (``--enable-auth --port 1``) is left alone.
    Every element also goes through :func:`redact_text` (``env HF_TOKEN=x cmd``).

    Args:
        argv: the launch argv.
    Returns:
        A list of the same length.
    """
    out: list[str] = []
    mask_next = False
    for a in argv:
        a = a if isinstance(a, str) else str(a)
        if mask_next and not a.startswith("--"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        if a.startswith("-") and "=" in a:
            name, _, _val = a.partition("=")
            out.append(f"{name}={MASK}" if is_secret_name(name) else redact_text(a))
            continue
        if a.startswith("-") and is_secret_name(a):
            mask_next = True
            out.append(a)
            continue
        out.append(redact_text(a))
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Mask secret-looking environment variables (a new dict; the input is not modified).

    Args:
        env: variable name -> value.
    Returns:
        Same keys; values of secret names become ``***``, other values go through
        :func:`redact_text` (a password inside ``MLFLOW_TRACKING_URI`` is masked).
    """
    return {k: (MASK if is_secret_name(k) else redact_text(v if isinstance(v, str) else str(v)))
            for k, v in env.items()}
