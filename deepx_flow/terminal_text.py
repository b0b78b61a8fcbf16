"""Text for a terminal: control characters shown, never acted on.

Names reach the terminal from what users and files give: node ids (`dx.input("...")`, a
spec's ids), partition keys, cluster and worker names, file paths, error messages. A terminal
acts on control characters instead of showing them: ESC starts sequences that clear the
screen (CSI, `\\x1b[2J`), set the window title or make a link (OSC, `\\x1b]8;;URL\\x07`); CR
and BS write over what was printed; BEL rings; C1 controls (U+0080..U+009F) are those
sequences in one character; Unicode's bidirectional formatting characters (U+202A..U+202E,
U+2066..U+2069 and the marks U+200E, U+200F, U+061C) reorder the text after them, so that a
name with U+202E reads backwards; U+2028 and U+2029 break lines. A name holding them could
forge or hide what a command prints.

`escaped(text)` writes each of them as a visible escape, as Python's repr does (`\\x1b`,
`\\u202e`), so a name stays recognisable. It is applied where text reaches a terminal: the
text tables (`text_table`, which `Plan.explain` and every table of the command line use) and
the command line's standard output and error (`escaping_output`, around `cli.main`), which
covers its error line and whatever else it prints. A progress bar, which moves the cursor on
purpose, writes to the stream beneath (`raw_stream`). HTML output is escaped for HTML instead:
a browser shows control characters as they are.
"""

from __future__ import annotations

import contextlib
import re
import sys

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}  # as repr writes them
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                       "\u2066-\u2069]")


def escaped(text: str, keep: str = "") -> str:
    """`text` with every control character (see the module docstring) but those in `keep`
    written as an escape, as repr writes it: `\\n`, `\\x1b` below U+0100, `\\u202e` above.

    Parameters
    ----------
    text : str
        What is about to be shown.
    keep : str, optional
        Control characters to leave as they are ("\\n" for text of several lines).

    Returns
    -------
    str
        The text, unchanged when it holds no control character.

    Examples
    --------
    >>> escaped("x\\x1b[2J\\u202ey")
    'x\\\\x1b[2J\\\\u202ey'
    """
    def visible(match: re.Match) -> str:
        char = match.group()
        if char in keep:
            return char
        code = ord(char)
        return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return _CONTROLS.sub(visible, text)


class EscapingStream:
    """A text stream that writes to `raw` with control characters escaped, line breaks
    kept; everything else (`isatty`, `fileno`, `encoding`, ...) is the raw stream's."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(escaped(text, keep="\n"))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


def raw_stream(stream):
    """The stream beneath an `EscapingStream` (for output that moves the cursor on purpose,
    with text of its own making), or `stream` itself."""
    return stream.raw if isinstance(stream, EscapingStream) else stream


@contextlib.contextmanager
def escaping_output():
    """`sys.stdout` and `sys.stderr` escaping control characters for the block, as they
    were after it."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(out), EscapingStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
