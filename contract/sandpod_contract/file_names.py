"""Which file names a person can trust on sight: the one rule for names that come out of a
sandbox (output files) or go into one (uploads).

A name is refused when any character of it is invisible or changes how the rest is shown:
control characters (Unicode category Cc: NUL, newline, escape, ...), format characters (Cf:
the bidirectional controls such as U+202E RIGHT-TO-LEFT OVERRIDE, which shows
`report\\u202etxt.exe` as `reportexe.txt`, and the zero-width characters such as U+200B ZERO
WIDTH SPACE, which make two different names look the same), line and paragraph separators
(Zl, Zp) and lone surrogates (Cs, which are not text). The runner applies the same rule
(images/runner/internal/runner/outputs.go); both are tested against one table
(images/runner/internal/runner/testdata/file_names.json).
"""

import unicodedata

# Unicode general category -> what a character of it is, in a refusal.
REFUSED_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "an invisible format character",
    "Cs": "a lone surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}
# Format characters that reorder the text around them (Unicode's Bidi_Control property).
BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


def describe_character(char: str) -> str:
    """`U+202E RIGHT-TO-LEFT OVERRIDE`; a character without a name (a control) by its code."""
    code = f"U+{ord(char):04X}"
    name = unicodedata.name(char, "")
    return f"{code} {name}" if name else code


def name_problem(name: str) -> str | None:
    """Why `name` (a file name or a `/`-separated path) is refused, naming its first
    offending character; None when it may be shown as it is."""
    for char in name:
        kind = REFUSED_CATEGORIES.get(unicodedata.category(char))
        if kind is None:
            continue
        if char in BIDI_CONTROLS:
            kind = "a bidirectional control character"
        return f"{describe_character(char)} ({kind})"
    return None
