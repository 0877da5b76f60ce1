"""The serve command a recipe makes: its template filled as sparkrun fills it, the flags
sparkrun renders from ``defaults`` when a recipe has no command, and the command read back
into the engine, the model, the flags and the parallel sizes (for :mod:`.recipes`).

Each engine's names (serve prefixes, model and parallel flags, the keys rendered first) are
its adapter's ``recipes`` facts; sparkrun's flag maps are :mod:`.sparkrun_flags`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sparkbuild.adapters import EngineAdapter
from sparkbuild.engines.recipe_source import Notes
from sparkbuild.engines.sparkrun_flags import SPARKRUN_VERSION, engine_flags, value_text
from sparkbuild.errors import UsageError
from sparkbuild.templates import expand

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: One literal shell word: shlex's own safe characters (ASCII letters, digits, ``@%+=:,./-_``).
_SHELL_WORD = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


# --- the command template ------------------------------------------------------------------


def scalar_text(value: object) -> str:
    return "" if value is None else str(value)


def render_command(
    template: str, values: Mapping[str, object], text_of: Callable[[object, str], str] | None = None
) -> str:
    """``{key}`` placeholders filled from ``values`` until nothing changes (a value may hold
    another placeholder); unknown ones are left as they are, as sparkrun leaves them.
    ``text_of(value, key)`` writes a value (default: its text). Bounded in fills and size by
    the one template expander (``templates.expand``)."""
    write = text_of or (lambda value, _key: scalar_text(value))
    texts = {key: write(value, key) for key, value in values.items()}
    text = expand(template.strip(), texts, what="the recipe's command template", source="defaults")
    return re.sub(r"\\[ \t]+\n", "\\\n", text)


#: Keys sparkrun's config chain holds beside the defaults (RECIPES.md, "Config Chain").
_CHAIN_KEYS = ("model", "model_revision", "resolved_model_path")


def _filled_default(key: str, value: object, values: Mapping[str, object], notes: Notes) -> object:
    """A default holding ``{placeholders}``, filled: sparkrun 0.4.2 hands it to the engine
    unfilled when the recipe has no command (the engine then refuses it), said in a note."""
    if not isinstance(value, str) or not PLACEHOLDER.search(value):
        return value
    filled = render_command(value, values)
    notes.add(
        f"defaults.{key}",
        "changed",
        f"{value!r} filled from the defaults ({filled}); sparkrun 0.4.2 passes it to the "
        "engine unfilled when the recipe has no command",
    )
    return filled


def _referenced(key: str, values: Mapping[str, object]) -> bool:
    return any(isinstance(v, str) and "{" + key + "}" in v for v in values.values())


def flags_from_defaults(
    adapter: type[EngineAdapter],
    values: Mapping[str, object],
    model: str,
    revision: str | None,
    notes: Notes,
) -> list[str]:
    """The flags sparkrun 0.4.2 renders for a recipe without a command: its flag map in its
    order (the adapter's ``leading_keys`` first), structured values as compact JSON,
    ``false`` on a flag the engine turns on by default as ``--no-<flag>``
    (engines/sparkrun_flags)."""
    engine, facts = adapter.name, adapter.recipes
    known = engine_flags(engine)
    words: list[str] = []
    first = facts.leading_keys
    if first and values.get(first[0]):
        words += [facts.rendered_keys[first[0]], str(values[first[0]])]
    if facts.pins_revision and revision and not model.startswith("/"):
        words += ["--revision", revision]  # sparkrun pins the model it serves
    for key in [*(k for k in known.flags if k not in known.after), *known.after]:
        if key not in first:
            value = values.get(key, known.defaults.get(key))
            words += known.words(key, _filled_default(key, value, values, notes))
    rendered = {*known.flags, *known.after, *known.aliases.values()}
    for key in values:
        if key not in rendered and key not in _CHAIN_KEYS and not _referenced(key, values):
            notes.add(
                f"defaults.{key}",
                "dropped",
                f"the recipe has no command, and sparkrun {SPARKRUN_VERSION}'s {engine} flag "
                "map does not list it: sparkrun drops it too (and warns)",
            )
    return words


def command_text(value: object, key: str, notes: Notes) -> str:
    """A value put into a command template. sparkrun 0.4.2 writes Python's ``str()`` there;
    for a mapping or a list that is not what the engine parses, so it is written as JSON
    and said."""
    if isinstance(value, Mapping | list):
        notes.add(
            f"defaults.{key}",
            "changed",
            f"a {type(value).__name__} in the command template written as JSON; sparkrun "
            f"{SPARKRUN_VERSION} writes Python's form of it, which the engine cannot parse",
        )
        return value_text(value)
    return scalar_text(value)


def command_words(text: str) -> list[str]:
    """The serve command's words as bash reads them (sparkrun runs the command as a bash
    script): quotes and backslashes honoured, line continuations joined. Anything bash
    would do besides running one command with literal arguments is refused, naming it: a
    second command (``;``, ``&``, ``|``, a line break outside quotes, even inside a word),
    a redirection, a substitution or expansion (``$(...)``, backticks, ``$VAR``), a
    comment."""
    words: list[str] = []
    scan = _Scan(text)
    while (word := scan.word()) is not None:
        words.append(word)
    return words


def model_word(model: str, where: str) -> str:
    """``model`` when a shell reads it as one literal word. sparkrun writes the model into
    the command template (``vllm serve {model}``) unquoted, then runs the command in a
    shell: a model holding ``;``, a backtick, a quote, a space or a line break would run as
    shell code on every node."""
    if _SHELL_WORD.fullmatch(model) is None:
        shown = model if len(model) <= 120 else model[:120] + "..."
        raise UsageError(
            f"{where} {shown!r} is not one plain shell word: sparkrun writes the model into "
            "the serve command unquoted, so a shell would run the rest",
            "name the model by a hub id (org/name) or a path of letters, digits and "
            "'@%+=:,./-_' only",
        )
    return model


#: Outside quotes, each makes bash do more than run one command with these words.
_OPERATORS = frozenset(";&|<>()`\n")
_EXPANDS = re.compile(r"\$[({A-Za-z0-9_@*#?$!'\"-]")


class _Scan:
    """One pass over a command, a word at a time (POSIX quoting: nothing is special inside
    single quotes; ``\\``, ``$`` and backticks stay special inside double quotes)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def refuse(self, what: str, *, parses: bool = True) -> UsageError:
        shown = self.text[max(0, self.at - 40) : self.at + 20]
        why = (
            "bash would do more than run one engine command with literal arguments, which "
            "is all a profile holds"
            if parses
            else "it is not a command bash reads"
        )
        return UsageError(
            f"the recipe's command {what} (at {shown!r}): {why}",
            "render the command by hand and write the profile's args",
        )

    def word(self) -> str | None:
        """The next word, or None at the end."""
        text = self.text
        while self.at < len(text) and (text[self.at] in " \t" or text.startswith("\\\n", self.at)):
            self.at += 2 if text[self.at] == "\\" else 1
        if self.at >= len(text):
            return None
        if text[self.at] == "\n":
            if text[self.at :].strip():
                raise self.refuse("has several lines without '\\' continuations")
            self.at = len(text)
            return None
        if text[self.at] == "#":
            raise self.refuse("has a comment ('#' starting a word)")
        return self._rest_of_word()

    def _rest_of_word(self) -> str:
        text, out = self.text, []
        while self.at < len(text) and text[self.at] not in " \t\n":
            char = text[self.at]
            if char == "'":
                end = text.find("'", self.at + 1)
                if end < 0:
                    raise self.refuse("has an unclosed single quote", parses=False)
                out.append(text[self.at + 1 : end])
                self.at = end + 1
            elif char == '"':
                out.append(self._double_quoted())
            elif char == "\\":
                if self.at + 1 >= len(text):
                    raise self.refuse("ends with a lone backslash", parses=False)
                if text[self.at + 1] != "\n":  # a continuation inside a word joins it
                    out.append(text[self.at + 1])
                self.at += 2
            elif char in _OPERATORS:
                raise self.refuse(f"uses the shell ({char!r})")
            elif _EXPANDS.match(text, self.at):
                raise self.refuse(f"uses the shell: an expansion ({text[self.at : self.at + 2]!r})")
            else:
                out.append(char)
                self.at += 1
        return "".join(out)

    def _double_quoted(self) -> str:
        text, out = self.text, []
        self.at += 1
        while self.at < len(text) and text[self.at] != '"':
            char = text[self.at]
            if char == "\\" and text[self.at + 1 : self.at + 2] in ('"', "\\", "$", "`", "\n"):
                out.append("" if text[self.at + 1] == "\n" else text[self.at + 1])
                self.at += 2
            elif char == "`" or (_EXPANDS.match(text, self.at) and text[self.at + 1] not in "'\""):
                shown = text[self.at : self.at + 2]
                raise self.refuse(f"uses the shell: an expansion in double quotes ({shown!r})")
            else:
                out.append(char)
                self.at += 1
        if self.at >= len(text):
            raise self.refuse("has an unclosed double quote", parses=False)
        self.at += 1
        return "".join(out)


# --- the serve command: engine, model, flags -----------------------------------------------


@dataclass(frozen=True)
class Ours:
    """A serve flag where sparkrun's command for a recipe and sparkbuild's launch of the
    profile made from it differ by design. ``launcher``: sparkbuild's launcher sets it (an
    import leaves it out of the profile's flags); else sparkrun adds it."""

    flag: str
    launcher: bool
    why: str


def ours(adapter: type[EngineAdapter]) -> tuple[Ours, ...]:
    """The one list of those differences (docs/smoke.md, "Round trips"): the bind address
    and port are the launcher's, and so are the flags it adds to every launch (the engine's
    ``launcher_flags``); sparkrun names the served model when a command does not."""
    found = [
        Ours("--host", True, "sparkbuild's launcher sets it (its bind address)"),
        Ours("--port", True, "sparkbuild's launcher sets it (a free port)"),
    ]
    found += [
        Ours(flag, True, f"sparkbuild's launcher adds it to every {adapter.display_name} launch")
        for flag in adapter.launcher_flags(())
    ]
    if adapter.recipes.adds_served_model_flag:
        found.append(
            Ours(
                adapter.recipes.adds_served_model_flag,
                False,
                "sparkrun adds the recipe's model as the served name when the command names "
                "none; sparkbuild's launcher leaves the engine's own",
            )
        )
    return tuple(found)


def _split_flags(words: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """``(flag, values)`` groups; a word before any flag is a positional (flag ``""``)."""
    flag: str = ""
    values: list[str] = []
    for word in words:
        if re.match(r"^--?[A-Za-z]", word):
            if flag or values:
                yield flag, values
            name, eq, value = word.partition("=")
            flag, values = (name, [value]) if eq and name.startswith("--") else (word, [])
        else:
            values.append(word)
    if flag or values:
        yield flag, values


@dataclass
class Serve:
    engine: str
    model: str
    args: list[str]
    sizes: dict[str, str]
    env: dict[str, str]


def _strip_prefix(
    adapter: type[EngineAdapter], words: list[str]
) -> tuple[list[str], dict[str, str]]:
    env: dict[str, str] = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    prefixes = adapter.recipes.prefixes
    for prefix in prefixes:
        if tuple(words[: len(prefix)]) == prefix:
            return words[len(prefix) :], env
    raise UsageError(
        f"the recipe's command does not start a {adapter.name} server "
        f"({' '.join(words[:3])!r}; expected e.g. {' '.join(prefixes[0])!r})",
        "a profile launches the engine's own server; write its args by hand",
    )


def serve_of(
    adapter: type[EngineAdapter],
    words: list[str],
    named: str,
    notes: Notes,
    base: Path,
    version: Version | None,
) -> Serve:
    rest, env = _strip_prefix(adapter, words)
    facts = adapter.recipes
    launched = {o.flag: o.why for o in ours(adapter) if o.launcher}
    model = named
    args: list[str] = []
    sizes: dict[str, str] = {}
    for flag, values in _split_flags(rest):
        if not flag:  # vllm serve MODEL
            model, extra = values[0], values[1:]
            if extra:
                raise UsageError(f"the recipe's command has stray words {' '.join(extra)!r}")
        elif flag in facts.model_flags and values:
            model = values[0]
        elif flag in launched:
            notes.add(f"{flag} {' '.join(values)}".strip(), "replaced", launched[flag])
        elif flag in facts.parallel_flags:
            sizes[facts.parallel_flags[flag]] = values[0] if values else "true"
            if facts.parallel_flags[flag] == "rank":
                notes.add(flag, "changed", "set per node by the multi-node launcher")
        elif flag == "--chat-template" and values and not _chat_template_kept(values[0], base):
            notes.add(
                f"{flag} {values[0]}",
                "dropped",
                "a file beside neither the recipe nor the engine: the recipe's mods "
                "put it in the container",
            )
        elif flag == "--load-format" and values:
            if _load_format_kept(adapter, values[0], version, notes):
                args += [flag, *values]
        else:
            args += [flag, *values]
    if model != named:
        notes.add("model", "changed", f"the command serves {model}, the recipe names {named}")
    return Serve(adapter.name, model, args, sizes, env)


def _chat_template_kept(value: str, base: Path) -> bool:
    if "{{" in value or "{%" in value or Path(value).is_absolute():
        return True  # an inline template, or a path where the engine runs
    return (base / value).is_file()


def _load_format_kept(
    adapter: type[EngineAdapter], name: str, version: Version | None, notes: Notes
) -> bool:
    fact = adapter.load_format(version, name)
    if fact is None:  # the engine has no facts on its load formats
        return True
    if fact.known is False:
        notes.add(
            f"--load-format {name}",
            "dropped",
            f"{fact.detail}; {adapter.display_name} would fail loading the weights, so 'auto' "
            "is used",
        )
        return False
    if fact.known is None:
        notes.add(f"--load-format {name}", "carried", f"not checked: {fact.detail}")
    return True
