"""Pruning a CUDA CMake file to sm_121a, by the shape of what it changes, not by line context.

sgl-kernel's ``CMakeLists.txt`` (``sgl-kernel/`` before SGLang 0.5.17,
``python/sglang/kernels/aot/`` from then on) hardcodes its ``-gencode`` lists: torch's arch
flags are cleared (``clear_cuda_arches``) and neither ``TORCH_CUDA_ARCH_LIST`` nor
``CMAKE_CUDA_ARCHITECTURES`` is read. :func:`prune_to_sm121a` rewrites such a file so that

- every gencode list (``set``/``list(APPEND ...)`` of one variable) builds sm_121a only: its
  least conditional entry becomes ``-gencode=arch=compute_121a,code=sm_121a`` and every other
  entry goes, whatever arch it names (0.5.18 renamed sm_103a to sm_100f: nothing to update);
- the named targets (FA3's ``flash_ops``, the separate ``common_ops_sm90_build``) are removed:
  every command that defines or uses them is commented out;
- the named includes (``cmake/flashmla.cmake``, which defines FlashMLA's target) are
  commented out.

What it changes it finds by shape: gencode tokens, commands whose target argument is a named
target, ``include()`` of a named file. A target, include or anchor list it must change and
cannot find, an arch flag it cannot read, or a target still used after removal is anchor drift:
:class:`AnchorDriftError` names the file and what was expected. Every edited line carries the
marker ``# sparkbuild-sm121a:``, so a pruned file is recognised and pruning twice changes
nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkbuild.errors import AnchorDriftError

STEP = "sm121a-prune"  # the step's name in the spec
# Bump when the output changes for the same input: locks made before then say so offline.
VERSION = 1
STEP_VERSIONS = {STEP: VERSION}
MARKER = "# sparkbuild-sm121a:"
KEEP = "sm_121a"
KEEP_TOKEN = '"-gencode=arch=compute_121a,code=sm_121a"'
# What sgl-kernel's file must have for the step to be sure it did its job (spec defaults).
FLAGS_VAR = "SGL_KERNEL_CUDA_FLAGS"
REMOVE_TARGETS = ("flash_ops", "common_ops_sm90_build")
REMOVE_INCLUDES = ("flashmla.cmake",)

_GENCODE = re.compile(
    r'(?P<q>"?)-gencode(?:=|\s+)arch=compute_(?P<arch>\d+[a-z]?),code=(?P<code>(?:sm|compute)_\d+[a-z]?)(?P=q)'
)
# Arch settings the step does not know how to rewrite: finding one is drift, not a pass.
_FOREIGN_ARCH = re.compile(r"(?<![\w-])(?:-gencode|--generate-code|--gpu-architecture|-arch)\b")
_COMMAND = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(")
_OPENERS = {"if", "foreach", "while", "function", "macro", "block"}
_CLOSERS = {"endif", "endforeach", "endwhile", "endfunction", "endmacro", "endblock"}
_ARG = re.compile(r'"(?:[^"\\]|\\.)*"|[^\s()"]+')


@dataclass(frozen=True)
class _Command:
    name: str
    start: int  # offset of the name
    end: int  # offset just past ")"
    depth: int  # enclosing if/foreach/function/... blocks
    args: tuple[str, ...]

    def target_args(self) -> tuple[str, ...]:
        """The targets this command defines or uses: its first argument, or what follows
        ``TARGETS`` (``install(TARGETS a b ...)``)."""
        if "TARGETS" in self.args:
            rest = self.args[self.args.index("TARGETS") + 1 :]
            names = []
            for arg in rest:
                if arg.isupper():  # the next keyword (LIBRARY, DESTINATION, ...)
                    break
                names.append(arg)
            return tuple(names)
        return self.args[:1]

    def list_var(self) -> str:
        """The variable a gencode token in this command is added to."""
        lowered = self.name.lower()
        if lowered in ("list", "string") and len(self.args) > 1:
            return self.args[1]
        return self.args[0] if self.args else self.name


@dataclass
class PruneResult:
    """What :func:`prune_to_sm121a` did, for the item's detail and the docs."""

    text: str
    kept: list[str] = field(default_factory=list)  # lists now building sm_121a only
    removed_archs: set[str] = field(default_factory=set)
    removed_targets: list[str] = field(default_factory=list)
    removed_includes: list[str] = field(default_factory=list)

    rewrote: bool = False  # an anchor entry was rewritten to sm_121a

    @property
    def changed(self) -> bool:
        return bool(
            self.removed_archs or self.removed_targets or self.removed_includes or self.rewrote
        )

    def summary(self) -> str:
        parts = [f"gencodes now {KEEP} only ({', '.join(self.kept)})"]
        if self.removed_archs:
            parts.append(f"dropped {', '.join(sorted(self.removed_archs, key=_arch_key))}")
        if self.removed_targets or self.removed_includes:
            gone = [*self.removed_targets, *self.removed_includes]
            parts.append(f"removed {', '.join(gone)}")
        return "; ".join(parts)


def _arch_key(arch: str) -> tuple[int, str]:
    digits = re.search(r"\d+", arch)
    return (int(digits.group()) if digits else 0, arch)


def _blank_comments(text: str) -> str:
    """``text`` with every comment replaced by spaces (newlines kept), so that offsets in it
    are offsets in ``text`` and no search matches commented-out code."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            continue
        if char == "#":
            bracket = re.match(r"#\[(=*)\[", text[i:])
            end = (
                text.find(f"]{bracket.group(1)}]", i) + len(bracket.group(1)) + 2
                if bracket
                else text.find("\n", i)
            )
            end = n if end < i else end
            for j in range(i, end):
                if out[j] != "\n":
                    out[j] = " "
            i = end
            continue
        i += 1
    return "".join(out)


def _commands(code: str) -> list[_Command]:
    """Every command invocation in comment-free ``code``, with its block depth."""
    commands: list[_Command] = []
    depth, i = 0, 0
    while True:
        match = _COMMAND.search(code, i)
        if match is None:
            return commands
        end = _closing_paren(code, match.end())
        args = tuple(_ARG.findall(code[match.end() : end - 1]))
        name = match.group(1).lower()
        if name in _CLOSERS or name in ("elseif", "else"):
            depth = max(depth - 1, 0)
        commands.append(_Command(match.group(1), match.start(), end, depth, args))
        if name in _OPENERS or name in ("elseif", "else"):
            depth += 1
        i = end


def _closing_paren(code: str, i: int) -> int:
    level = 1
    while i < len(code) and level:
        char = code[i]
        if char == '"':
            i += 1
            while i < len(code) and code[i] != '"':
                i += 2 if code[i] == "\\" else 1
        elif char == "(":
            level += 1
        elif char == ")":
            level -= 1
        i += 1
    return i


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


class _Editor:
    """Edits by line of the original text, applied at the end (so offsets stay valid)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.commented: dict[int, str] = {}  # line -> why (first line of a command) or ""
        self.tokens: dict[int, list[tuple[int, str, str, str]]] = {}  # column, old, new, note

    def comment_out(self, command: _Command, why: str) -> None:
        first, last = _line_of(self.text, command.start), _line_of(self.text, command.end - 1)
        for number in range(first, last + 1):
            self.commented.setdefault(number, why if number == first else "")

    def replace_token(self, offset: int, old: str, new: str, note: str) -> None:
        number = _line_of(self.text, offset)
        column = offset - (self.text.rfind("\n", 0, offset) + 1)
        self.tokens.setdefault(number, []).append((column, old, new, note))

    def result(self) -> str:
        out = []
        for number, line in enumerate(self.lines, start=1):
            ending = "\n" if line.endswith("\n") else ""
            body = line.rstrip("\n")
            indent = body[: len(body) - len(body.lstrip())]
            if number in self.commented:
                why = self.commented[number]
                out.append(f"{indent}{MARKER} {body.lstrip()}{f'  ({why})' if why else ''}{ending}")
                continue
            notes = []
            for column, old, new, note in sorted(self.tokens.get(number, []), reverse=True):
                assert body[column : column + len(old)] == old
                body = body[:column] + new + body[column + len(old) :]
                notes.append(note)
            if not notes:
                out.append(line)
            elif not _blank_comments(body).strip():  # the tokens were all its code: a note
                kept = f"  {body.strip()}" if body.strip() else ""  # its own comment, if any
                out.append(f"{indent}{MARKER} {'; '.join(reversed(notes))}{kept}{ending}")
            else:
                out.append(f"{body.rstrip()}  {MARKER} {'; '.join(reversed(notes))}{ending}")
        return "".join(out)


def gencode_archs(text: str) -> list[str]:
    """The archs (``code=``) of the gencode tokens in ``text`` outside comments, in order."""
    return [m.group("code") for m in _GENCODE.finditer(_blank_comments(text))]


def prune_to_sm121a(
    text: str,
    path: str,
    *,
    flags_var: str = FLAGS_VAR,
    remove_targets: Sequence[str] = REMOVE_TARGETS,
    remove_includes: Sequence[str] = REMOVE_INCLUDES,
) -> PruneResult:
    """``text`` (the CMake file at ``path``) with only sm_121a left; see the module doc."""
    code = _blank_comments(text)
    commands = _commands(code)
    editor = _Editor(text)
    result = PruneResult(text=text)
    drift = _Drift(path)

    _prune_gencodes(code, commands, editor, result, drift, flags_var)
    for target in remove_targets:
        _remove_target(text, code, commands, editor, result, drift, target)
    for name in remove_includes:
        _remove_include(text, commands, editor, result, drift, name)
    drift.raise_if_any()
    result.text = editor.result()
    left = set(gencode_archs(result.text))
    if left - {KEEP}:  # cannot happen unless this module is wrong: never pass it on
        drift.expected(f"only {KEEP} gencodes after pruning, found {', '.join(sorted(left))}")
        drift.raise_if_any()
    return result


class _Drift:
    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[str] = []

    def expected(self, what: str) -> None:
        self.problems.append(what)

    def raise_if_any(self) -> None:
        if self.problems:
            raise AnchorDriftError(
                f"anchor drift in {self.path}: expected " + "; expected ".join(self.problems),
                "check the step against this release's file and narrow the step's `when` (or "
                "adjust its expectations) in the spec; `sparkbuild prepare BUILD` shows the tree",
            )


def _prune_gencodes(
    code: str,
    commands: list[_Command],
    editor: _Editor,
    result: PruneResult,
    drift: _Drift,
    flags_var: str,
) -> None:
    tokens: dict[str, list[tuple[_Command, re.Match[str]]]] = {}
    for command in commands:
        span = code[command.start : command.end]
        for match in _GENCODE.finditer(span):
            tokens.setdefault(command.list_var(), []).append((command, match))
        leftover = _GENCODE.sub(lambda m: " " * len(m.group()), span)
        foreign = _FOREIGN_ARCH.search(leftover)
        if foreign:
            line = _line_of(code, command.start + foreign.start())
            drift.expected(
                f"arch flags only as -gencode=arch=compute_XX,code=sm_XX; line {line} has "
                f"{foreign.group()!r} in {command.name}(), which this step cannot rewrite"
            )
    if flags_var not in tokens:
        drift.expected(
            f"a -gencode entry in {flags_var} (set({flags_var} ...) or list(APPEND {flags_var} "
            "...)), the list the kernel targets compile with"
        )
    for var, entries in tokens.items():
        depths = [c.depth for c in commands if c.list_var() == var and c.name.lower() == "set"]
        least = min(command.depth for command, _ in entries)
        if depths and least > min(depths):
            line = _line_of(code, entries[0][0].start)
            drift.expected(
                f"an unconditional -gencode entry in {var} (every entry, from line {line}, is "
                f"inside an if(): sm_121a would not always be built)"
            )
            continue
        anchor = next((c, m) for c, m in entries if c.depth == least)
        result.kept.append(var)
        for command, match in entries:
            offset = command.start + match.start()
            if (command, match) == anchor:
                if match.group("code") != KEEP or match.group("arch") != "121a":
                    editor.replace_token(
                        offset, match.group(), KEEP_TOKEN, f"was {match.group('code')}"
                    )
                    result.rewrote = True
                    if match.group("code") != KEEP:
                        result.removed_archs.add(match.group("code"))
                continue
            editor.replace_token(offset, match.group(), "", f"dropped {match.group()}")
            if match.group("code") != KEEP:
                result.removed_archs.add(match.group("code"))


def _already_removed(text: str, word: str) -> bool:
    pattern = re.compile(rf"^\s*{re.escape(MARKER)}.*(?<![\w-]){re.escape(word)}(?![\w-])", re.M)
    return bool(pattern.search(text))


def _remove_target(
    text: str,
    code: str,
    commands: list[_Command],
    editor: _Editor,
    result: PruneResult,
    drift: _Drift,
    target: str,
) -> None:
    using = [c for c in commands if target in c.target_args()]
    if not using:
        if not _already_removed(text, target):
            drift.expected(
                f"the target {target} (Python_add_library({target} ...) and the commands using "
                "it) to remove; none found"
            )
        return
    for command in using:
        others = [name for name in command.target_args() if name != target]
        if others:
            drift.expected(
                f"{target} alone in {command.name}() at line {_line_of(code, command.start)}; "
                f"it also names {', '.join(others)}, which must stay"
            )
            return
    for command in using:
        editor.comment_out(command, f"{target} removed: no sm_121a code")
    spans = [(c.start, c.end) for c in using]
    for found in re.finditer(rf"(?<![\w-]){re.escape(target)}(?![\w-])", code):
        if not any(start <= found.start() < end for start, end in spans):
            drift.expected(
                f"no use of {target} outside the commands removed; line "
                f"{_line_of(code, found.start())} still uses it"
            )
            return
    result.removed_targets.append(target)


def _remove_include(
    text: str,
    commands: list[_Command],
    editor: _Editor,
    result: PruneResult,
    drift: _Drift,
    name: str,
) -> None:
    includes = [
        c
        for c in commands
        if c.name.lower() == "include" and c.args and c.args[0].strip('"').endswith(name)
    ]
    if not includes:
        if not _already_removed(text, name):
            drift.expected(f"include(.../{name}) to remove; none found")
        return
    for command in includes:
        editor.comment_out(command, f"{name} removed: its targets have no sm_121a code")
    result.removed_includes.append(name)
