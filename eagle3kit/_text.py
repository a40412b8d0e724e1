"""Text as eagle3kit shows it: strings from data made safe for a terminal, and the one
human formatting of counts, sizes and durations every stage uses.

Text from data (partition names, finish reasons, ids, server answers, paths) reaches the
terminal only through `printable`: a control character in it (ESC starting a sequence that
clears the screen or erases the line above, a carriage return, a backspace) is written as
visible text instead. Every function of eagle3kit._ui that prints applies it.
"""

from __future__ import annotations

import re

_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters and DEL: what a terminal acts on rather than shows."""
_BIDI = "\u202a-\u202e\u2066-\u2069"
"""Unicode's bidirectional embeddings, overrides and isolates: they reorder the text after
them on the line, so a string from data could rearrange the rest of eagle3kit's own line."""
_SHOWN_ESCAPED = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_BIDI}]")
_C1 = re.compile(f"[\\x7f-\\x9f{_BIDI}]")
"""What JSON may hold raw that a terminal showing it would act on."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if ord(char) > 0xFF:
        return f"\\u{ord(char):04x}"
    return _NAMED.get(char) or f"\\x{ord(char):02x}"


def json_for_terminal(data: str) -> str:
    """JSON text with DEL, the C1 controls (CSI, 0x9b) and the bidi controls escaped
    (\\u009b): JSON allows them raw, and a terminal showing it would act on them. The parsed
    strings are the same."""
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", data)


def control_in(text: str) -> str | None:
    """The first control character of `text`, escaped ('\\x1b'); None when it has none."""
    match = _CONTROLS.search(text)
    return None if match is None else _escaped(match)


def printable(text: object, one_line: bool = True) -> str:
    """`text` with each control character written as visible text ('\\x1b', '\\r'), so a
    string from a dataset or a server cannot move the cursor, clear the screen or hide a
    line; the bidi controls too ('\\u202e'), so it cannot reorder the line either. A message
    (`one_line=False`) keeps its own line breaks and tabs."""
    text = str(text)
    if one_line:
        return _SHOWN_ESCAPED.sub(_escaped, text)
    return _SHOWN_ESCAPED.sub(lambda m: m.group() if m.group() in "\n\t" else _escaped(m), text)


def human_count(x: float) -> str:
    """312000 -> '312k': rates and counts are read at a glance, not to the last digit. The
    one human-number formatter (with human_bytes) every stage uses."""
    for scale, name in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{name}"
    return f"{x:.3g}"


def human_bytes(x: float) -> str:
    """2.7e9 -> '2.52 GiB': sizes on disk and in memory, to three figures."""
    for scale, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {name}"
    return f"{x:.0f} B"


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def duration(seconds: float, tenths: bool = False) -> str:
    """90 -> '1m30s', as the status lines show elapsed time and ETA; with `tenths`, a time
    under a minute to the tenth (8.2s), as plan's forecasts of a short run show it."""
    if tenths and seconds < 60:
        return f"{max(0.0, seconds):.1f}s"
    return _duration(seconds)


def plain_number(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:.3g}"
