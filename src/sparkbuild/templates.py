"""The one template expander: ``{name}`` filled from named strings, nothing else.

Templates come from users (``--repository``, ``--alias``, a spec's ``tags:``, ``--command``).
``str.format`` over objects would let ``{version.__init__.__globals__[os]}`` walk from a
value to the process's modules and environment, and ``{build.nope}`` raise a bare
AttributeError; here a field is a plain name from a fixed set, with no attribute or index
access, conversion or format spec, and anything else is refused naming the field.
"""

from __future__ import annotations

import string
from collections.abc import Mapping

from sparkbuild.errors import UnknownPlaceholderError

_PARSER = string.Formatter()


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
