"""sparkbuild preflight probe: runs under the engine's own interpreter, on the CPU.

Shipped as package data and run as a script, either in a local venv (the patched tree put
first on sys.path) or inside the built image (``docker run`` with no GPU), so both places run
the same checks. Input: a JSON plan (argv[1]). Output: one JSON document on stdout after the
line ``@@SPARKBUILD-PREFLIGHT@@`` (engine imports print to stdout freely before it).

Each check returns {"status": "pass"|"fail"|"skip", "detail": str, "items": [...]}.
Standard library only at module level: the engine's own packages are imported by the checks.
The probe names no engine: what it needs to know of one (its flags, its variables, how its
launch parser is called) comes in the plan, from the engine's adapter (``engine_facts``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import importlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MARKER = "@@SPARKBUILD-PREFLIGHT@@"
SPEC_COUNT_FLAGS = (
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)
SPEC_COUNT_FIELDS = (
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)

Check = dict[str, Any]
# The kernel packages' stand-ins (sparkbuild_native.Hooks), once installed by run(), and the
# engine's package (named in errors).
_STATE: dict[str, Any] = {"standins": None, "package": None}


def result(status: str, detail: str, items: Sequence[object] | None = None) -> Check:
    return {"status": status, "detail": detail, "items": items or []}


# -- helpers ----------------------------------------------------------------------------


def package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {package!r} is not importable from {sys.executable}")
    return Path(next(iter(spec.submodule_search_locations)))


def dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def module_name(package: str, rel: str) -> str:
    parts = list(Path(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def describe_error(exc: BaseException, unavailable: dict[str, str]) -> dict[str, object]:
    """What failed, with the missing module or name and the package we left out, if any."""
    info: dict[str, Any] = {"error": f"{type(exc).__name__}: {exc}"}
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        info["missing_module"] = exc.name
        top = exc.name.split(".")[0]
        if top in unavailable:
            info["unavailable_package"] = unavailable[top]
    elif isinstance(exc, ImportError):
        found = re.search(r"cannot import name '([^']+)' from '([^']+)'", str(exc))
        if found:
            info["missing_name"] = found.group(1)
            info["from_module"] = found.group(2)
    hooks = _STATE["standins"]
    owner = hooks.owner_of_module(info.get("from_module") or "") if hooks else None
    if owner is not None:
        info["package"] = owner.label  # the real package version whose API was checked
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        info["at"] = f"{last.filename}:{last.lineno}"
        package = _STATE["package"]
        if not str(exc):
            # A bare `assert` says nothing: name the engine's line that raised it instead.
            where = (
                re.sub(rf".*/(?={re.escape(package)}/)", "", last.filename)
                if package
                else last.filename
            )
            info["error"] += f"(no message) at {where}:{last.lineno}: {last.line or ''}".rstrip()
    return info


def try_import(name: str, unavailable: dict[str, str]) -> dict[str, object] | None:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            importlib.import_module(name)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return describe_error(exc, unavailable)
    return None


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


# -- package checks -----------------------------------------------------------------------


def check_compile(root: Path, changed: list[str]) -> Check:
    files = [c for c in changed if c.endswith(".py")]
    if not files:
        return result("pass", "no changed Python files")
    failures = []
    for rel in files:
        try:
            compile((root / rel).read_bytes(), str(root / rel), "exec", dont_inherit=True)
        except SyntaxError as exc:
            failures.append({"file": rel, "error": f"line {exc.lineno}: {exc.msg}"})
    if failures:
        names = ", ".join(f["file"] for f in failures)
        return result("fail", f"{len(failures)} changed file(s) do not compile: {names}", failures)
    return result("pass", f"{len(files)} changed file(s) compile", files)


def _imported_modules(tree: ast.AST, own: str, package: str) -> set[str]:
    found: set[str] = set()
    own_parts = own.split(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_parts[: len(own_parts) - node.level + 1]
                if own.endswith("__init__"):
                    base = own_parts[: len(own_parts) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names)
    return {m for m in found if m == package or m.startswith(package + ".")}


def importers_of(root: Path, package: str, targets: set[str]) -> list[str]:
    """Modules of the package whose source imports one of ``targets``."""
    found = []
    for path in python_files(root):
        rel = str(path.relative_to(root))
        name = module_name(package, rel)
        if name in targets:
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError:
            continue
        # A module's own name for relative imports is its package for __init__ files.
        own = name if not rel.endswith("__init__.py") else name + ".__init__"
        if _imported_modules(tree, own, package) & targets:
            found.append(name)
    return found


def check_imports(root: Path, package: str, changed: list[str], plan: dict[str, Any]) -> Check:
    unavailable = plan.get("unavailable_modules", {})
    mods = [module_name(package, c) for c in changed if c.endswith(".py")]
    if not mods:
        return result("pass", "no changed modules")
    importers = importers_of(root, package, set(mods)) if plan.get("importers", True) else []
    items = []
    for name in [*mods, *importers]:
        failure = try_import(name, unavailable)
        role = "changed" if name in mods else "importer"
        items.append({"module": name, "role": role, "ok": failure is None, **(failure or {})})
    return summarize_imports(items)


def summarize_imports(items: list[dict[str, Any]]) -> Check:
    failed = [i for i in items if not i["ok"] and not i.get("unavailable_package")]
    skipped = [i for i in items if not i["ok"] and i.get("unavailable_package")]
    count = f"{len(items)} module(s) ({sum(i['role'] == 'changed' for i in items)} changed)"
    if failed:
        lines = [import_failure_line(i) for i in failed]
        return result(
            "fail", f"{len(failed)} of {count} fail to import: " + "; ".join(lines), items
        )
    if skipped:
        names = sorted({i["unavailable_package"] for i in skipped})
        return result(
            "skip",
            f"{len(skipped)} of {count} need packages not installable on this CPU: "
            + ", ".join(names),
            items,
        )
    return result("pass", f"{count} import", items)


def import_failure_line(item: Mapping[str, object]) -> str:
    if item.get("missing_name"):
        package = f" ({item['package']})" if item.get("package") else ""
        return (
            f"{item['module']} imports name {item['missing_name']!r} that "
            f"{item['from_module']}{package} does not have (a prerequisite change is missing)"
        )
    if item.get("missing_module"):
        return f"{item['module']} needs module {item['missing_module']!r}, which is missing"
    return f"{item['module']}: {item['error']}"


def entry_classes(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_bytes())
    except SyntaxError:
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
        ):
            value = node.value
            elts = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            return [e.id for e in elts if isinstance(e, ast.Name)]
    return []


def check_registry(root: Path, package: str, plan: dict[str, Any]) -> Check:
    """Import every model module; report failing modules with their classes."""
    rel_dir = plan.get("registry_dir")
    if not rel_dir or not (root / rel_dir).is_dir():
        return result("skip", "no model registry directory for this engine")
    unavailable = plan.get("unavailable_modules", {})
    failing = []
    files = sorted((root / rel_dir).glob("*.py"))
    for path in files:
        if path.name == "__init__.py":
            continue
        name = module_name(package, str(path.relative_to(root)))
        failure = try_import(name, unavailable)
        if failure is not None:
            failing.append({"module": name, "classes": entry_classes(path), **failure})
    detail = f"{len(files)} model modules, {len(failing)} fail to import on this CPU"
    return result("pass", detail, failing)


def check_signals(root: Path, signals: list[dict[str, Any]], source: str) -> Check:
    """Each metric/field the adapters rely on appears in the engine's serving code."""
    if not signals:
        return result("skip", "no signals listed for this engine")
    texts = []
    for path in python_files(root):
        if "test" in path.relative_to(root).parts[:1] or "test" in path.parts[-2:-1]:
            continue
        texts.append((path, path.read_text(encoding="utf-8", errors="replace")))
    items, missing = [], []
    for signal in signals:
        name = signal["name"]
        forms = {name}
        if signal.get("kind") == "metric" and name.endswith("_total"):
            forms.add(name[: -len("_total")])  # prometheus_client adds _total to counters
        pattern = re.compile("|".join(f"[\"']{re.escape(f)}[\"']" for f in forms))
        where = next((f"{p.relative_to(root)}" for p, text in texts if pattern.search(text)), None)
        items.append({**signal, "found": where})
        if where is None:
            missing.append(signal)
    if missing:
        lines = [
            f"{s['kind']} {s['name']} ({s.get('used_for', 'used by the adapter')})" for s in missing
        ]
        fix = (
            f"fix: the adapter must not rely on these for this version ({source}), or the "
            "version must provide them"
        )
        return result(
            "fail", "not in this version's source: " + "; ".join(lines) + "; " + fix, items
        )
    return result("pass", f"{len(signals)} signal(s) found", items)


# -- per-profile checks -------------------------------------------------------------------


class _ParsedError(Exception):
    """Raised in place of ``ServerArgs.from_cli_args``: the launch's own parse is done."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


class Engine:
    """The engine under test: its package, and the facts its adapter handed over.

    Its launch parser is one of two kinds (``parser``): ``server_args``, a ``ServerArgs``
    class with ``prepare_server_args`` (``srt/server_args.py``), or ``arg_parser``, a
    ``make_arg_parser`` over a ``FlexibleArgumentParser`` with ``AsyncEngineArgs`` building the
    engine config.
    """

    def __init__(self, name: str, package: str, facts: dict[str, Any]) -> None:
        self.name = name
        self.package = package
        self.facts = facts

    @property
    def server_args_kind(self) -> bool:
        return bool(self.facts["parser"] == "server_args")

    @property
    def model_flag(self) -> str:
        return str(self.facts["model_flag"])

    def module(self, relative: str) -> Any:
        return importlib.import_module(f"{self.package}.{relative}")

    def parser(self) -> argparse.ArgumentParser:
        """The engine's parser, for its option strings (hints and notes)."""
        if self.server_args_kind:
            parser = argparse.ArgumentParser(prog=self.facts["prog"])
            self.module("srt.server_args").ServerArgs.add_cli_args(parser)
            return parser
        return self.arg_parser()

    def arg_parser(self) -> argparse.ArgumentParser:
        try:
            flexible = self.module("utils.argparse_utils").FlexibleArgumentParser
        except (ImportError, AttributeError):
            flexible = self.module("utils").FlexibleArgumentParser
        # The server's own parser; it moved from entrypoints/openai to entrypoints/launchers.
        for relative in ("entrypoints.openai.cli_args", "entrypoints.launchers.cli_args"):
            name = f"{self.package}.{relative}"
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name != name:
                    raise
                continue
            return module.make_arg_parser(flexible(prog=self.facts["prog"]))  # type: ignore[no-any-return]
        raise ModuleNotFoundError(
            f"no {self.facts['prog']} server argument parser (make_arg_parser) found"
        )

    def parse(self, argv: list[str]) -> argparse.Namespace:
        """Parse as the engine does at launch."""
        if self.server_args_kind:
            return self.server_args_parse(argv)
        return self.arg_parser().parse_args(argv)

    def server_args_parse(self, argv: list[str]) -> argparse.Namespace:
        """Parse as ``serve`` does at launch: the release's own ``prepare_server_args`` (its
        parser, ``--config`` merging, argparse's abbreviations), stopped just before it
        builds ``ServerArgs``."""
        server_args = self.module("srt.server_args")
        prepare = getattr(server_args, "prepare_server_args", None)
        if prepare is None:  # older releases: the parser alone
            parser = argparse.ArgumentParser(prog=self.facts["prog"])
            server_args.ServerArgs.add_cli_args(parser)
            return parser.parse_args(argv)

        def capture(cls: object, namespace: argparse.Namespace) -> object:
            raise _ParsedError(namespace)

        cls = server_args.ServerArgs
        saved = cls.__dict__.get("from_cli_args")  # None: inherited from a base class
        cls.from_cli_args = classmethod(capture)
        try:
            prepare(list(argv))
        except _ParsedError as parsed:
            return parsed.namespace
        finally:
            if saved is None:
                del cls.from_cli_args
            else:
                cls.from_cli_args = saved
            logging.disable(logging.WARNING)  # prepare_server_args reconfigures logging
        raise RuntimeError("prepare_server_args returned without building ServerArgs")

    def server_config(self, namespace: argparse.Namespace) -> object:
        """The server's config from parsed flags, as the engine builds it at launch."""
        if self.server_args_kind:
            return self.module("srt.server_args").ServerArgs.from_cli_args(namespace)
        args = self.module("engine.arg_utils").AsyncEngineArgs.from_cli_args(namespace)
        return args.create_engine_config()


def parse_flags(engine: Engine, argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    """Parse as the engine does at launch; a rejection comes back as the engine's message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return engine.parse(argv), ""
    except SystemExit:
        lines = [line for line in stderr.getvalue().strip().splitlines() if line.strip()]
        error = [line for line in lines if ": error: " in line]
        return None, (error[-1] if error else lines[-1] if lines else "rejected")


def given_flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--") and len(a) > 2]


def flag_forms(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Every long option string -> the action's first long option (its full name)."""
    forms = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        for option in longs:
            forms[option] = longs[0]
    return forms


def spelled_as(flag: str, forms: dict[str, str]) -> str | None:
    """What an accepted spelling stands for (a prefix or the underscore form), naming the
    option it matched and, where that is an alias, the action's full flag."""
    if flag in forms:
        return None
    dashed = "--" + flag[2:].replace("_", "-")
    matched = [dashed] if dashed in forms else sorted(o for o in forms if o.startswith(dashed))
    if not matched or len({forms[o] for o in matched}) != 1:
        return None
    option, full = matched[0], forms[matched[0]]
    return option if option == full else f"{option} (= {full})"


def check_flags(engine: Engine, profile: dict[str, Any], unavailable: dict[str, str]) -> Check:
    try:
        forms = flag_forms(engine.parser())
    except Exception as exc:
        return import_problem("the engine's argument parser", exc, unavailable)
    flags = given_flags(profile["args"])
    argv = [engine.model_flag, profile["model_dir"] or "model", *profile["args"]]
    namespace, error = parse_flags(engine, argv)
    if namespace is None:
        return rejected_flags(error, flags, forms)
    notes = [{"flag": f, "full": full} for f in flags if (full := spelled_as(f, forms)) is not None]
    detail = f"the engine's launch parser accepts {len(flags)} flag(s) with their values"
    if notes:
        detail += "; " + "; ".join(
            f"note: {n['flag']} is accepted as {n['full']}"
            + ("" if "_" in n["flag"] else " (argparse abbreviation)")
            for n in notes
        )
    return result("pass", detail, [*flags, *notes])


def rejected_flags(error: str, flags: list[str], forms: dict[str, str]) -> Check:
    """The engine's own message, plus the nearest known names for flags it does not know."""
    known = sorted(forms)
    unknown = [f for f in flags if f not in forms and spelled_as(f, forms) is None]
    unknown = [f for f in unknown if not any(o.startswith(f) for o in known)]
    hints = []
    for flag in unknown:
        near = difflib.get_close_matches(flag, known, n=3, cutoff=0.6)
        if near:
            hints.append(f"{flag}: nearest {', '.join(near)}")
    detail = f"the engine's launch parser rejects the flags: {error}"
    if hints:
        detail += " (" + "; ".join(hints) + ")"
    return result("fail", detail, [{"flag": f} for f in unknown] or [{"error": error}])


def import_problem(what: str, exc: BaseException, unavailable: dict[str, str]) -> Check:
    info = describe_error(exc, unavailable)
    if info.get("unavailable_package"):
        return result(
            "skip",
            f"{what} needs {info['unavailable_package']}, which cannot be installed on this "
            f"CPU ({info['error']})",
            [info],
        )
    return result("fail", f"{what} does not load: {info['error']}", [info])


def engine_env_names(root: Path, engine: Engine) -> tuple[set[str], set[str]]:
    """(declared in the env module, mentioned anywhere in the package source)."""
    alternatives = "|".join(engine.facts["env_prefixes"])
    pattern = re.compile(rf"\b(?:{alternatives})[A-Z0-9_]+\b")
    env_module = root / engine.facts["env_module"]
    declared = set(pattern.findall(env_module.read_text())) if env_module.exists() else set()
    anywhere: set[str] = set()
    literal = re.compile(rf"[\"']((?:{alternatives})[A-Z0-9_]+)[\"']")
    for path in python_files(root):
        anywhere.update(literal.findall(path.read_text(encoding="utf-8", errors="replace")))
    return declared, anywhere


def check_env(root: Path, engine: Engine, profile: dict[str, Any], env_names: Any) -> Check:
    env = profile.get("env") or {}
    if not env:
        return result("pass", "the profile sets no environment variables")
    declared, anywhere = env_names
    prefixes = tuple(engine.facts["env_prefixes"])
    env_file = engine.facts["env_module"]
    items, unread = [], []
    for name in sorted(env):
        if not name.startswith(prefixes):
            items.append({"name": name, "read": None, "note": f"not a {engine.name} variable"})
            continue
        where = env_file if name in declared else ("package source" if name in anywhere else None)
        items.append({"name": name, "read": where})
        if where is None:
            unread.append(name)
    if unread:
        lines = [unread_env_line(n, declared | anywhere, env_file) for n in unread]
        return result("fail", "; ".join(lines), items)
    return result("pass", f"{len(env)} variable(s) read by this version", items)


def key_word(name: str, known: set[str]) -> tuple[str, int]:
    """The word of ``name`` rarest among the known variables (NAN, not CHECK or LOGITS)."""
    words = [w for w in name.split("_")[1:] if len(w) > 1 and w not in {"ENABLE", "DISABLE"}]
    counts = {w: sum(w in k.split("_") for k in known) for w in words}
    word = min(words, key=lambda w: (counts[w], -len(w)))
    return word, counts[word]


def related_names(name: str, known: set[str]) -> list[str]:
    """Near spellings first (a typo), then the variables sharing the name's rarest word."""
    near = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.85)
    related: list[str] = []
    if "_" in name.strip("_"):
        word, count = key_word(name, known)
        related = sorted(k for k in known if word in k.split("_")) if count else []
    return list(dict.fromkeys([*near, *related]))[:6]


def unread_env_line(name: str, known: set[str], env_file: str) -> str:
    candidates = related_names(name, known)
    if candidates:
        hint = f"it reads {', '.join(candidates)}: set the switch this version reads"
    else:
        word = key_word(name, known)[0] if "_" in name.strip("_") else name
        hint = (
            f"it reads no variable with {word} in its name: drop the switch for this "
            "version, or do not ship the profile on it"
        )
    return f"{name} is never read by this version ({env_file} and the package source); {hint}"


# -- config ------------------------------------------------------------------------------


def write_model_dir(dest: Path, model: dict[str, Any], engine: Engine) -> tuple[Path, str]:
    """A config-only model directory generated from the real transformers config class."""
    if model.get("path"):
        return Path(model["path"]), "local model directory"
    dest.mkdir(parents=True, exist_ok=True)
    model_type = model["model_type"]
    from transformers import CONFIG_MAPPING

    # The engine's own config class for the type wins, as it does in the engine's loader.
    own = engine_config_classes(engine).get(model_type)
    # Not .get(): transformers' lazy mapping loads the class only through __getitem__.
    lazy = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None  # noqa: SIM401
    cls = own or lazy
    if cls is not None:
        config = cls(**model.get("config", {}))
        config.architectures = model.get("architectures") or None
        config.save_pretrained(dest)
        how = f"generated from transformers' {type(config).__name__}"
    else:
        # This transformers lacks the class: write what the checkpoint declares, so the
        # engine's own loader meets the same file it would meet on the Spark.
        data = {"model_type": model_type, "architectures": model.get("architectures", [])}
        (dest / "config.json").write_text(json.dumps(data))
        how = f"declared only ({model_type} is not in this transformers)"
    return dest, how


def engine_config_classes(engine: Engine) -> dict[str, Any]:
    """model type -> config class the engine registers over transformers' own."""
    if importlib.util.find_spec(engine.package) is None:
        return {}
    try:
        registry = engine.module(engine.facts["config_registry"])._CONFIG_REGISTRY
    except (ImportError, AttributeError):
        return {}
    return {key: registry[key] for key in list(registry)}


def load_draft_config(path: Path, model: Mapping[str, object], trust: bool) -> Check:
    from transformers import AutoConfig

    version = dist_version("transformers")
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust)
    except Exception as exc:
        first = model.get("min_transformers")
        fix = (
            f"pin transformers>={first} (the first release with model type "
            f"{model['model_type']!r}) in the build's requirements"
            if first
            else "pin a transformers release that has this model type in the build's requirements"
        )
        return result(
            "fail",
            f"the draft's config ({model.get('id')}, model type {model['model_type']!r}) does "
            f"not load with transformers {version}: AutoConfig.from_pretrained raised "
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}; fix: {fix}",
        )
    return result("pass", f"AutoConfig loaded {type(config).__name__} (transformers {version})")


def model_import_cause(
    engine: Engine, exc: BaseException, architectures: list[str], unavailable: dict[str, str]
) -> BaseException | None:
    """An engine that inspects the model class in a subprocess reports only "failed to be
    inspected" (``model_inspector``): import the class's module here to name what is really
    missing."""
    inspector = engine.facts.get("model_inspector")
    if not inspector or "failed to be inspected" not in str(exc):
        return None
    module, _, attribute = inspector.partition(":")
    try:
        models = getattr(engine.module(module), attribute)
    except (ImportError, AttributeError):
        return None
    for arch in architectures:
        if arch in models:
            name = f"{engine.package}.{module.rpartition('.')[0]}.{models[arch][0]}"
            try:
                importlib.import_module(name)
            except ImportError as inner:
                return inner
    return None


def server_args_from(engine: Engine, argv: list[str]) -> object:
    namespace, error = parse_flags(engine, argv)
    if namespace is None:
        raise ValueError(f"flags rejected: {error}")
    with contextlib.redirect_stdout(io.StringIO()):
        return engine.server_config(namespace)


def without_count_flags(args: list[str]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in SPEC_COUNT_FLAGS:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def reserved_tokens(root: Path, engine: Engine, server_args: object) -> int:
    """Run the release's own reserved-token computation for ``server_args``."""
    utils = root / "srt/managers/utils.py"
    if utils.exists() and "def compute_num_reserved_tokens" in utils.read_text():
        function = engine.module("srt.managers.utils").compute_num_reserved_tokens
        if function.__code__.co_argcount:
            return int(function(server_args))
        # From 0.5.18 it reads the spec settings from the runtime context, which the
        # tokenizer process publishes at boot: publish them the same way first.
        publish_for_tokenizer(engine, server_args)
        return int(function())
    path = root / "srt/managers/tokenizer_manager.py"
    return int(_inline_reserved_tokens(path, engine, server_args))


def resolved_spec(engine: Engine, server_args: object) -> object:
    """The speculative settings as the boot path reads them: from 0.5.18 the runtime
    context's resolved ``spec`` namespace (published by the tokenizer), else ServerArgs."""
    if importlib.util.find_spec(f"{engine.package}.srt.runtime_context") is None:
        return server_args
    context = engine.module("srt.runtime_context")
    if not hasattr(context, "get_spec"):
        return server_args
    publish_for_tokenizer(engine, server_args)
    return context.get_spec()


def publish_for_tokenizer(engine: Engine, server_args: object) -> None:
    setter = getattr(engine.module("srt.server_args"), "set_global_server_args_for_tokenizer", None)
    if setter is not None:
        setter(server_args)
        return
    engine.module("srt.runtime_context").publish(server_args, role="tokenizer")


def _inline_reserved_tokens(path: Path, engine: Engine, server_args: object) -> Any:
    """Up to 0.5.16 the computation is inline in TokenizerManager.__init__: run that
    statement (the release's or the patched text) on its own."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Attribute)
            and node.targets[0].attr == "num_reserved_tokens"
            and not isinstance(node.value, ast.Constant)
        ):
            body = ast.Module(body=[node], type_ignores=[])
            holder = type("Holder", (), {})()
            namespace: dict[str, object] = {"self": holder, "server_args": server_args}
            exec(
                compile(ast.fix_missing_locations(body), str(path), "exec"),
                {**module_globals(f"{engine.package}.srt.managers.tokenizer_manager"), **namespace},
            )
            return holder.num_reserved_tokens
    raise LookupError(f"{path}: no num_reserved_tokens computation found")


def module_globals(name: str) -> dict[str, object]:
    """A module's globals for running one of its statements; when the module itself needs a
    CUDA-only package, the statement runs with builtins only (it reads ``server_args``)."""
    try:
        return dict(vars(importlib.import_module(name)))
    except ImportError:
        return {}


def later_uses(root: Path) -> list[str]:
    """Boot-path code that uses the speculative counts as numbers (named in a failure)."""
    probes = [
        ("srt/managers/tokenizer_manager.py", "speculative_num_draft_tokens - 1"),
        ("srt/speculative/frozen_kv_mtp_worker.py", "* self.topk"),
    ]
    found = []
    for rel, needle in probes:
        path = root / rel
        if path.exists():
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if needle in line:
                    found.append(f"{rel}:{number} `{line.strip()}`")
                    break
    return found


def check_config(
    root: Path, engine: Engine, profile: dict[str, Any], plan: dict[str, Any]
) -> Check:
    unavailable = plan.get("unavailable_modules", {})
    workdir = Path(plan["workdir"]) / profile["name"]
    steps: list[dict[str, object]] = []
    target = profile.get("target")
    if not target:
        return result("skip", f"no known architecture for model {profile.get('model')!r}")
    try:
        target_dir, how = write_model_dir(workdir / "target", target, engine)
    except Exception as exc:
        return import_problem("generating the target config", exc, unavailable)
    steps.append({"step": "target config", "status": "pass", "detail": how})
    args = list(profile["args"])
    draft = profile.get("draft")
    if draft:
        draft_dir, how = write_model_dir(workdir / "draft", draft, engine)
        loaded = load_draft_config(draft_dir, draft, "--trust-remote-code" in args)
        steps.append({"step": "draft config", **loaded, "how": how})
        if loaded["status"] != "pass":
            return result("fail", loaded["detail"], steps)
        args = [draft_dir if a == draft.get("id") else a for a in args]
        args = [str(a) for a in args]
    argv = [engine.model_flag, str(target_dir), *args]
    extra = engine.facts.get("config_args") or []
    if extra and extra[0] not in args:
        argv += extra
    try:
        server_args = server_args_from(engine, argv)
    except Exception as exc:
        cause = model_import_cause(engine, exc, target.get("architectures") or [], unavailable)
        return config_failure(
            "building the server config from the profile flags", cause or exc, steps, unavailable
        )
    steps.append({"step": "server config", "status": "pass", "detail": type(server_args).__name__})
    if not engine.server_args_kind:
        return result("pass", "EngineArgs built the engine config from the profile flags", steps)
    return speculative_steps(root, engine, argv, server_args, steps, unavailable)


GPU_ONLY = re.compile(
    r"platform support|only supported on (?:CUDA|cuda)|CUDA is not available|"
    r"no CUDA GPUs|requires (?:a )?(?:CUDA|GPU)",
)


def config_failure(
    what: str,
    exc: BaseException,
    steps: list[dict[str, Any]],
    unavailable: dict[str, str],
) -> Check:
    if GPU_ONLY.search(str(exc)):
        # The engine checks the GPU platform itself here; a CPU cannot stand in for it.
        detail = f"{what} checks the GPU platform, which a CPU run cannot stand in for: {exc}"
        steps.append({"step": what, "status": "skip", "detail": detail})
        return result("skip", detail, steps)
    checked = import_problem(what, exc, unavailable)
    steps.append({"step": what, **checked})
    return result(checked["status"], checked["detail"], steps)


def speculative_steps(
    root: Path,
    engine: Engine,
    argv: list[str],
    server_args: Any,
    steps: list[dict[str, Any]],
    unavailable: dict[str, str],
) -> Check:
    if not getattr(server_args, "speculative_algorithm", None):
        return result("pass", "server config built (no speculative decoding)", steps)
    try:
        reserved = reserved_tokens(root, engine, server_args)
    except Exception as exc:
        return config_failure("the reserved-token computation", exc, steps, unavailable)
    steps.append({"step": "reserved tokens", "status": "pass", "detail": str(reserved)})
    # The same boot with the speculative counts left to the engine's defaults: what a user
    # who omits them gets, and where the shipped reserved-token fix alone fell short.
    bare = without_count_flags(argv)
    try:
        defaulted = server_args_from(engine, bare)
        resolved = resolved_spec(engine, defaulted)
        unset = [f for f in SPEC_COUNT_FIELDS if getattr(resolved, f, None) is None]
        if not unset:
            reserved_default = reserved_tokens(root, engine, defaulted)
    except Exception as exc:
        return config_failure(
            "the speculative defaults (count flags unset)", exc, steps, unavailable
        )
    algorithm = getattr(defaulted, "speculative_algorithm", None)
    if unset:
        uses = later_uses(root)
        detail = (
            f"with {', '.join(SPEC_COUNT_FLAGS)} unset, {algorithm} leaves "
            f"{', '.join(f'{f}=None' for f in unset)} after ServerArgs"
            + (f"; the boot path then computes with them: {'; '.join(uses)}" if uses else "")
            + "; fix: fill the defaults (topk 1, draft tokens = steps + 1) where "
            f"{algorithm} is set up in server_args.py, not only in the reserved-token max()"
        )
        steps.append({"step": "speculative defaults", "status": "fail", "detail": detail})
        return result("fail", detail, steps)
    filled = {f: getattr(resolved, f) for f in SPEC_COUNT_FIELDS}
    steps.append(
        {
            "step": "speculative defaults",
            "status": "pass",
            "detail": f"{algorithm}: {filled}, reserved tokens {reserved_default}",
        }
    )
    return result("pass", f"server config, reserved tokens ({reserved}) and defaults", steps)


# -- main --------------------------------------------------------------------------------


def guarded(function: Any, *args: Any) -> Check:
    try:
        return function(*args)  # type: ignore[no-any-return]
    except Exception as exc:
        return result("fail", f"the check itself failed: {type(exc).__name__}: {exc}")


def install_standins(plan: Mapping[str, object]) -> None:
    """Kernel packages from their real Python, with stand-ins for their native loads."""
    if not plan.get("standins") and not plan.get("gpu"):
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    native = importlib.import_module("sparkbuild_native")
    sys.path.pop(0)
    _STATE["standins"] = native.install(
        plan.get("standins") or [], plan.get("gpu"), plan.get("standin_site")
    )


def native_loads() -> list[dict[str, object]]:
    if _STATE["standins"] is None:
        return []
    seen = {json.dumps(item, sort_keys=True) for item in _STATE["standins"].loaded}
    return [json.loads(item) for item in sorted(seen)]


def run(plan: dict[str, Any]) -> dict[str, Any]:
    if plan.get("package_root"):
        sys.path.insert(0, plan["package_root"])
    os.environ.update(plan.get("process_env", {}))
    install_standins(plan)
    package = plan["package"]
    _STATE["package"] = package
    engine = Engine(plan["engine"], package, plan["engine_facts"])
    root = package_dir(package)
    changed = [c for c in plan.get("changed", []) if (root / c).exists()]
    wanted = set(
        plan.get("checks", ["compile", "imports", "registry", "signals", "flags", "env", "config"])
    )
    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "package_dir": str(root),
        "versions": {
            **{n: dist_version(n) for n in ("transformers", "torch")},
            # The first of the engine's distributions installed (a CPU build has its own).
            engine.name: next(
                (v for n in engine.facts["distributions"] if (v := dist_version(n))), None
            ),
        },
        "checks": {},
        "profiles": {},
    }
    checks = out["checks"]
    if "compile" in wanted:
        checks["compile"] = guarded(check_compile, root, changed)
    if "imports" in wanted:
        checks["imports"] = guarded(check_imports, root, package, changed, plan)
    if "registry" in wanted:
        checks["registry"] = guarded(check_registry, root, package, plan)
    if "signals" in wanted:
        signals = plan.get("signals", [])
        source = engine.facts.get("signals_source", "")
        checks["signals"] = guarded(check_signals, root, signals, source)
    env_names = engine_env_names(root, engine) if "env" in wanted else (set(), set())
    unavailable = plan.get("unavailable_modules", {})
    for profile in plan.get("profiles", []):
        verdicts: dict[str, Check] = {}
        if "flags" in wanted:
            verdicts["flags"] = guarded(check_flags, engine, profile, unavailable)
        if "env" in wanted:
            verdicts["env"] = guarded(check_env, root, engine, profile, env_names)
        if "config" in wanted:
            saved = dict(os.environ)
            os.environ.update(profile.get("env") or {})
            try:
                verdicts["config"] = guarded(check_config, root, engine, profile, plan)
            finally:
                os.environ.clear()
                os.environ.update(saved)
        out["profiles"][profile["name"]] = verdicts
    out["native_loads"] = native_loads()
    if _STATE["standins"] is not None:
        out["standins"] = [s.label for s in _STATE["standins"].standins]
    return out


def main() -> int:
    logging.disable(logging.WARNING)
    plan = json.loads(Path(sys.argv[1]).read_text())
    with contextlib.redirect_stdout(sys.stderr):
        report = run(plan)
    sys.stdout.write(MARKER + "\n" + json.dumps(report, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
