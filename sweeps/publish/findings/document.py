"""The mechanics of the findings document: the marked section inside an arbitrary
markdown file, the splice that replaces it, its JSON data line and the atomic write.

The section sits between the markers::

    <!-- servesweep:begin -->
    ...generated...
    <!-- servesweep:data {...json...} -->
    <!-- servesweep:end -->

Everything outside the section is kept byte for byte, so people can write notes above
and below it. A file without markers gets the section appended (nothing lost); a
malformed section (a lone begin or end marker, several sections) is recreated once,
never duplicated. Nothing here knows what the section says.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("servesweep.findings")

BEGIN = "<!-- servesweep:begin -->"
END = "<!-- servesweep:end -->"
HEADER = "<!-- servesweep:generated: edits inside this section are overwritten; write notes above or below it -->"
DATA_PREFIX = "<!-- servesweep:data "

_BEGIN_RE = re.compile(r"^[ \t]*<!--\s*servesweep:begin\b[^\n]*-->[ \t]*\r?$", re.M)
_END_RE = re.compile(r"^[ \t]*<!--\s*servesweep:end\b[^\n]*-->[ \t]*\r?$", re.M)
_DATA_RE = re.compile(r"^[ \t]*<!--\s*servesweep:data (\{.*\})\s*-->[ \t]*\r?$", re.M)
_HEADER_RE = re.compile(r"^[ \t]*<!--\s*servesweep:generated\b[^\n]*-->[ \t]*\r?$", re.M)


def without_markers(text: str) -> str:
    """``text`` with every servesweep marker line removed (begin, end, the generated header and
    the JSON data line): what a viewer that shows HTML comments as text (MLflow's artifact
    view) gets. The notes around the section and the section's content are kept."""
    for rx in (_BEGIN_RE, _END_RE, _DATA_RE, _HEADER_RE):
        text = rx.sub("\x00", text)
    return re.sub(r"^\x00\n?", "", text, flags=re.M)


def _line_span(text: str, m: re.Match) -> tuple[int, int]:
    """(start, end) of the whole line holding ``m``, end past its newline."""
    s = text.rfind("\n", 0, m.start()) + 1
    e = text.find("\n", m.end())
    return s, (len(text) if e < 0 else e + 1)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    spans = sorted(spans)
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        if merged and s < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged


def find_sections(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of every servesweep section in ``text``.

    A begin marker pairs with the next end marker before the next begin. A lone begin
    ends at its section's data line (the generated last line before the end marker) or,
    if that is missing too, at the next begin / end of file. A lone end starts at the
    generator header line before it (else the span is the marker line alone). Spans
    include their trailing newline and never overlap.
    """
    begins = [_line_span(text, m) for m in _BEGIN_RE.finditer(text)]
    ends = [_line_span(text, m) for m in _END_RE.finditer(text)]
    datas = [_line_span(text, m) for m in _DATA_RE.finditer(text)]
    headers = [_line_span(text, m) for m in _HEADER_RE.finditer(text)]
    spans: list[tuple[int, int]] = []
    used_ends: set[int] = set()
    for i, (bs, be) in enumerate(begins):
        limit = begins[i + 1][0] if i + 1 < len(begins) else len(text)
        end = next((e for e in ends if e[0] >= be and e[1] <= limit and e[0] not in used_ends), None)
        if end is not None:
            used_ends.add(end[0])
            spans.append((bs, end[1]))
            continue
        data = [d for d in datas if d[0] >= be and d[1] <= limit]
        spans.append((bs, data[-1][1] if data else limit))
    for es, ee in ends:
        if es in used_ends or any(s <= es < e for s, e in spans):
            continue
        prev_end = max([e for s, e in spans if e <= es], default=0)
        hdr = [h for h in headers if prev_end <= h[0] < es]
        spans.append((hdr[0][0] if hdr else es, ee))
    return _merge(spans)


def splice_section(text: str, section: str) -> str:
    """``text`` with its servesweep section replaced by ``section`` (which must start with
    :data:`BEGIN` and end with :data:`END` + newline).

    Text outside the section(s) is kept byte for byte. The first section found is replaced
    in place, any further ones are removed; with none, ``section`` is appended after a
    blank line.
    """
    spans = find_sections(text)
    if not spans:
        if not text:
            return section
        sep = "" if text.endswith("\n") else "\n"
        return text + sep + "\n" + section
    out: list[str] = []
    pos = 0
    for i, (s, e) in enumerate(spans):
        out.append(text[pos:s])
        if i == 0:
            out.append(section)
        pos = e
    out.append(text[pos:])
    return "".join(out)


def read_data_block(text: str) -> dict[str, Any]:
    """The JSON of the first section's ``servesweep:data`` line ({} when absent or unreadable)."""
    spans = find_sections(text)
    for s, e in spans or [(0, len(text))]:
        m = _DATA_RE.search(text, s, e)
        if m:
            try:
                data = json.loads(m.group(1))
                return data if isinstance(data, dict) else {}
            except ValueError:
                log.warning("findings: unreadable servesweep:data block; baseline history starts afresh")
                return {}
    return {}


def data_line(data: Mapping[str, Any]) -> str:
    """The ``servesweep:data`` comment line holding ``data`` as one line of JSON."""
    # '<' and '>' escaped so the JSON can never close the HTML comment early
    body = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    body = body.replace("<", "\\u003c").replace(">", "\\u003e")
    return f"{DATA_PREFIX}{body} -->"


def read_document(path: Path) -> str:
    """The document's text ('' when it does not exist); undecodable bytes survive a
    round trip through :func:`atomic_write` (surrogateescape)."""
    return path.read_bytes().decode("utf-8", "surrogateescape") if path.exists() else ""


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory + ``os.replace``
    (a reader or a killed writer never sees a half-written file). Keeps the old mode.

    Raises:
        OSError: the directory cannot be created or written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8", "surrogateescape"))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        except OSError:
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

