"""The one template expander: ``{name}`` filled from named strings, nothing else.

Templates come from users (``--repository``, ``--alias``, a spec's ``tags:``, ``--command``,
a recipe's serve command). A recipe's values may hold placeholders themselves, filled again
(:func:`expand`): bounded in depth (``MAX_PASSES`` fills) and in size (``MAX_EXPANDED``
bytes), since ten values that each repeat the next eight times are a few hundred bytes of
recipe and ``8**10`` of command.
``str.format`` over objects would let ``{version.__init__.__globals__[os]}`` walk from a
value to the process's modules and environment, and ``{build.nope}`` raise a bare
AttributeError; here a field is a plain name from a fixed set, with no attribute or index
access, conversion or format spec, and anything else is refused naming the field.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping

from sparkbuild.errors import TemplateTooLargeError, UnknownPlaceholderError

_PARSER = string.Formatter()
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Fills of a template whose values hold placeholders: more means a value refers to itself.
MAX_PASSES = 10
#: Bytes an expanded template may reach: a serve command is a few hundred.
MAX_EXPANDED = 64 * 1024


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each ``{name}`` replaced by ``values[name]`` (``{{``/``}}`` are
    literal braces). UnknownPlaceholderError names the first field that is not one of
    ``values``' names, or a brace that does not pair."""
    try:
        parts = list(_PARSER.parse(template))
    except ValueError as exc:  # a lone '{' or '}'
        raise UnknownPlaceholderError(f"{exc} (write {{{{ or }}}} for a literal brace)") from None
    out: list[str] = []
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        field = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
        field += "}"
        if name not in values or spec or conversion:
            raise UnknownPlaceholderError(f"{field} is not a placeholder")
        out.append(str(values[name]))
    return "".join(out)


def expand(template: str, values: Mapping[str, str], *, what: str, source: str) -> str:
    """``template`` with each ``{name}`` of ``values`` filled, again and again until nothing
    changes (a value may hold another placeholder); unknown ones are left as they are.
    TemplateTooLargeError, naming ``what``, the ``source`` of the values and the limit, past
    ``MAX_PASSES`` fills or ``MAX_EXPANDED`` bytes: checked as each placeholder is filled,
    so nothing grows past it."""
    text = template
    for _ in range(MAX_PASSES):
        filled = _fill_once(text, values, what, source)
        if filled == text:
            return text
        text = filled
    raise TemplateTooLargeError(
        f"{what} still changes after {MAX_PASSES} fills (the limit): a {source} value "
        "refers to itself",
        f"fix the {source} values",
    )


def _fill_once(text: str, values: Mapping[str, str], what: str, source: str) -> str:
    size = len(text.encode())

    def one(match: re.Match[str]) -> str:
        nonlocal size
        if match[1] not in values:
            return match[0]
        value = values[match[1]]
        size += len(value.encode()) - len(match[0])
        if size > MAX_EXPANDED:
            raise TemplateTooLargeError(
                f"{what} expands past {MAX_EXPANDED} bytes (the limit): its {source} values "
                "repeat placeholders that repeat others",
                f"fix the {source} values",
            )
        return value

    if size > MAX_EXPANDED:
        raise TemplateTooLargeError(
            f"{what} is over {MAX_EXPANDED} bytes (the limit)", f"fix the {source} values"
        )
    return _PLACEHOLDER.sub(one, text)
