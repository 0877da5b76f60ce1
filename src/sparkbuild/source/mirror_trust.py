"""What a cached mirror is trusted with, and the checks before each use (docs/source.md,
"What the mirror cache trusts").

A mirror is a bare git repository that sparkbuild runs git in: its commits become the pinned
source, the lock's tree hashes and the image. Git runs what a repository's configuration
and hooks name (``credential.helper``, ``core.sshCommand`` on a fetch, a
``reference-transaction`` hook on every ref update), borrows objects from wherever
``objects/info/alternates`` points, and rewrites history by ``info/grafts``. So a mirror is
used only when it proves itself, as preflight's caches do (``cachetrust``):

- the ``mirrors/`` directory is the user's own, written by no one else, as is every
  directory above it (``cachetrust.private_dir``);
- every file and directory of the mirror is the user's, written by no one else, with no
  symlink or special file among them (``cachetrust.tree_problem``);
- its configuration holds only the keys sparkbuild writes (and ``git init``'s own), with
  the URL it was made for; no hook, alternates, grafts or shallow file is there.

Its objects are checked by their own hashes, by git. A mirror that fails is removed and made
again with a note, where a run makes mirrors (``Mirror.locked``); a command that only reads
the cache (``lock --check``, ``report``) does not use it.
"""

from __future__ import annotations

from pathlib import Path

from sparkbuild import cachetrust, git

#: The keys a mirror's config may hold: git init's, and those ``Mirror._configure`` sets.
ALLOWED_KEYS = frozenset(
    {
        "core.repositoryformatversion",
        "core.filemode",
        "core.bare",
        "core.logallrefupdates",
        "core.ignorecase",
        "core.precomposeunicode",
        "core.symlinks",
        "gc.auto",
        "remote.origin.url",
        "remote.origin.promisor",
        "remote.origin.partialclonefilter",
        "extensions.partialclone",
    }
)
#: Files that make git read objects or history from elsewhere, or change it.
FORBIDDEN = ("objects/info/alternates", "objects/info/http-alternates", "info/grafts", "shallow")


def config_problem(path: Path, url: str | None) -> str | None:
    """Why the mirror ``path``'s config is not one sparkbuild wrote (for ``url``: None
    leaves the URL unchecked), or None. Read as a file: nothing it includes is followed."""
    done = git.run(["config", "--file", str(path / "config"), "--list", "-z"], check=False)
    if done.returncode != 0:
        return "has a config git cannot read"
    values: dict[str, str] = {}
    for entry in done.stdout.decode(errors="replace").split("\0"):
        if entry:
            key, _, value = entry.partition("\n")
            values[_normal(key)] = value
    unknown = sorted(set(values) - ALLOWED_KEYS)
    if unknown:
        return f"config sets {unknown[0]}, which sparkbuild never writes"
    if url is not None and values.get("remote.origin.url") != url:
        return "config names another URL than the mirror's"
    return None


def _normal(key: str) -> str:
    """git's key with its section and name lower case (a subsection keeps its case)."""
    section, _, rest = key.partition(".")
    middle, _, name = rest.rpartition(".")
    return ".".join(part for part in (section.lower(), middle, name.lower()) if part)


def mirror_problem(path: Path, url: str | None = None) -> str | None:
    """Why the mirror at ``path`` is not used, or None (see the module's docstring)."""
    why = cachetrust.chain_problem(path.parent) or cachetrust.tree_problem(path)
    if why is not None:
        return why
    planted = [name for name in FORBIDDEN if (path / name).exists()]
    if planted:
        return f"has {planted[0]}, which sparkbuild never writes"
    hooks = path / "hooks"
    names = [p.name for p in hooks.iterdir()] if hooks.is_dir() else []
    live = sorted(name for name in names if not name.endswith(".sample"))
    if live:
        return f"has the hook {live[0]}, which sparkbuild never writes"
    return config_problem(path, url)


__all__ = ["ALLOWED_KEYS", "config_problem", "mirror_problem"]
