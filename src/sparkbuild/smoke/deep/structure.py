"""How a text is read into units for the long-text judge (:mod:`.text`): words and
symbols, with structure read as structure (docs/smoke.md, "What counts as structure").

* a **rule** (``---``, ``====``, ``*****``, box drawing, a table's separator row
  ``|---|:--:|``, a grid line ``+----+----+``) is one unit, whatever its length; a rule over
  ``MAX_RULE_CHARS`` is a run of one character, not a rule;
* a **table row** (``| a | b |``) is one unit;
* a **code** line (in a fenced block, or indented four spaces as Markdown's code) is one
  unit; a fenced block, a line (JSON lines) or a whole text that parses whole as JSON is
  one unit (data the model closed: a loop runs to ``max_tokens`` and leaves its JSON open);
* a row or code line over ``MAX_ROW_CHARS`` is text in structure: its words count too;
* a **list** item's marker (``-``, ``*``, ``1.``), a heading's ``#`` and a quote's ``>``
  are not units; the item's, heading's or quote's words are, and each item or heading starts
  a new sequence of sentences (parallel items are not restatements);
* a link, a markup tag (``<td class="x">``) and a short quoted string (``"name"``) are one
  unit each; ``|`` elsewhere separates and is no unit.

So structure repeats its *shape* legitimately; the same row, rule, line or item over and
over is still a run or loop of units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparkbuild import jsontext

#: A rule longer than this is a run of one character (docs' rules and code banners are
#: shorter than 120).
MAX_RULE_CHARS = 240
#: A table row or line of code longer than this is text in it: its words are judged too.
MAX_ROW_CHARS = 400
# Rule characters: ASCII's, and box drawing (U+2500-U+257F: tables and diagrams in text).
_RULE_CHARS = "-=*_~#+.^/\\<>\u2500-\u257f"
# A word, a run of three or more of one rule character (one unit), or one other symbol;
# ``|`` separates (table cells, alternatives in a grammar) and is no unit.
# A link, a markup tag and a short quoted string are one unit each (structure: a changelog's
# links, HTML, JSON's keys and values).
UNIT = re.compile(
    rf"(?:https?|ftp)://[^\s)\]>\"']+|<[a-zA-Z/!][^<>\n]{{0,200}}>|\"[^\"\n]{{1,64}}\""
    rf"|\w+|([{_RULE_CHARS}])\1{{2,}}|[^\w\s|]"
)
# A line of rule characters, table pipes and alignment colons only: a rule, a table's
# separator row or a grid line.
_RULE_LINE = re.compile(rf"[\s|:+]*([{_RULE_CHARS}])\1{{2,}}[{_RULE_CHARS}\s|:+]*")
_RULE_CHAR = re.compile(f"[{_RULE_CHARS}]")
_TABLE_ROW = re.compile(r"\s*\|.*\|\s*")
_MARKER = re.compile(r"\s*(?:>+\s*)*(?P<item>#{1,6}\s+|[-*+\u2022]\s+|\d{1,3}[.)]\s+)?")
# Markdown's indented code: four spaces or a tab (a list item indented as deep is an item).
_INDENTED = re.compile(r"(?: {4}|\t)")
_FENCE = re.compile(r"\s*(```|~~~)")


@dataclass
class Reading:
    """A text read line by line into units, its prose apart (for sentences)."""

    units: list[str] = field(default_factory=list)
    prose: list[str] = field(default_factory=list)  # lines outside tables, rules and code
    prose_at: list[int] = field(default_factory=list)  # where each starts in the prose text
    line_units: list[int] = field(default_factory=list)  # the unit each of those starts at
    long_rules: list[tuple[int, str]] = field(default_factory=list)  # (unit, rule) too long
    fresh: set[int] = field(default_factory=set)  # prose lines that start an item or heading
    fenced: list[str] | None = None  # the lines of a code block not closed yet
    size: int = 0

    def line(self, line: str) -> None:
        if _FENCE.match(line):
            self._fence()
        elif self.fenced is not None:
            self.fenced.append(line)
        elif _RULE_LINE.fullmatch(line):
            self._rule(line.strip())
        elif _TABLE_ROW.fullmatch(line):
            self._row(line)
        elif whole_json(line):  # a JSON line: one record
            self._line_unit(line.strip(), line)
        else:
            marker = _MARKER.match(line)
            item = marker is not None and bool(marker.group("item"))
            if _INDENTED.match(line) and not item:
                self._code(line)
            else:
                body = line[marker.end() :] if marker else line
                self._text(body, prose=True, fresh=item)

    def _fence(self) -> None:
        """A code block opens, or closes: JSON that parses whole is data (one unit), any
        other code is one unit a line, never prose."""
        if self.fenced is None:
            self.fenced = []
            return
        self.close()

    def close(self) -> None:
        """The code block still open is judged as it is (a text cut inside one)."""
        lines, self.fenced = self.fenced, None
        if lines is None:
            return
        if whole_json("\n".join(lines)):
            self.units.append("<json>")
            return
        for line in lines:
            self._code(line)

    def _rule(self, rule: str) -> None:
        if len(rule) > MAX_RULE_CHARS:
            self.long_rules.append((len(self.units), rule))
        self.units.append(_rule_unit(rule))

    def _row(self, row: str) -> None:
        """A table row is one unit; a row too long to be a row is text in a table."""
        cells = " | ".join(cell.strip() for cell in row.strip().strip("|").split("|"))
        self._line_unit(f"|{cells}|", row)

    def _code(self, line: str) -> None:
        self._line_unit(line.strip(), line)

    def _line_unit(self, unit: str, line: str) -> None:
        """A line of structure as one unit; one too long to be a row or a line of code is
        text in it, and its words are judged too."""
        if unit:
            self.units.append(unit)
        if len(line) > MAX_ROW_CHARS:
            self._text(line, prose=False)

    def _text(self, body: str, *, prose: bool, fresh: bool = False) -> None:
        """A line's units; a prose line's text kept for sentences (``fresh``: a list item
        or heading, whose first sentence restates nothing before it)."""
        start = len(self.units)
        for match in UNIT.finditer(body):
            unit = match.group()
            if match.group(1):
                self._rule(unit)
            else:
                self.units.append(unit)
        if prose:
            if fresh:
                self.fresh.add(len(self.prose))
            self.prose_at.append(self.size)
            self.line_units.append(start)
            self.prose.append(body.lower())
            self.size += len(body) + 1

    @property
    def prose_text(self) -> str:
        return "\n".join(self.prose)


def words(text: str) -> list[str]:
    """A text's units: words and symbols, read as structure (the module's doc)."""
    return read(text).units


def read(text: str) -> Reading:
    """``text`` read into units, line by line, its prose apart."""
    reading = Reading()
    if whole_json(text):
        reading.units.append("<json>")
        return reading
    for line in text.splitlines():
        reading.line(line)
    reading.close()
    return reading


def whole_json(text: str) -> bool:
    """Whether ``text`` is one JSON object or array, closed: data the model finished, not a
    text that loops (a loop runs to ``max_tokens`` and leaves its JSON open)."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return False
    try:
        return isinstance(jsontext.loads(stripped), dict | list)
    except ValueError:
        return False


def _rule_unit(rule: str) -> str:
    """A rule as one unit, the same for any length: its commonest character, three times."""
    marks = [c for c in rule if _RULE_CHAR.fullmatch(c)]
    return max(set(marks), key=marks.count) * 3 if marks else rule


def rule_char(rule: str) -> str:
    """The character a rule is made of (its commonest)."""
    return _rule_unit(rule)[0]


def clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = [
    "MAX_ROW_CHARS",
    "MAX_RULE_CHARS",
    "UNIT",
    "Reading",
    "clip",
    "read",
    "rule_char",
    "whole_json",
    "words",
]
