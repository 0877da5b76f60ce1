"""Which changed files an overlay image carries, and which it may leave behind.

An overlay replaces files in the installed package only. A PR that also touches the
repository's tests or docs is still a Python-only change: those files never reach an
installed package, so the overlay leaves them out (and the status detail says so). Anything
else outside the package directory (build files, kernels, other packages) needs a source build.
"""

from __future__ import annotations

from pathlib import PurePosixPath

# Directory names that hold tests or documentation in SGLang's and vLLM's trees.
_TEST_DIRS = frozenset({"test", "tests", "testing"})
_DOC_DIRS = frozenset({"doc", "docs"})
_DOC_SUFFIXES = (".md", ".rst")


def package_relative(package_dir: str, path: str) -> str | None:
    """``path`` relative to ``package_dir``, or None when it lies outside it."""
    pure = PurePosixPath(path)
    package = PurePosixPath(package_dir)
    if pure == package or package not in pure.parents:
        return None
    return str(pure.relative_to(package))


def is_test_or_doc(path: str) -> bool:
    """A test or documentation file: under a test/docs directory, a test module, or prose."""
    pure = PurePosixPath(path)
    directories = set(pure.parts[:-1])
    if directories & (_TEST_DIRS | _DOC_DIRS):
        return True
    name = pure.name
    if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
        return True
    return name.endswith(_DOC_SUFFIXES)


def left_out(package_dir: str, paths: tuple[str, ...] | list[str]) -> list[str]:
    """The tests and docs outside the package: allowed in an overlay build, not in the image."""
    return sorted(
        p for p in paths if package_relative(package_dir, p) is None and is_test_or_doc(p)
    )


def refused(package_dir: str, paths: tuple[str, ...] | list[str]) -> list[str]:
    """Files outside the package that an overlay cannot leave out."""
    return sorted(
        p for p in paths if package_relative(package_dir, p) is None and not is_test_or_doc(p)
    )


def left_out_note(package_dir: str, paths: tuple[str, ...] | list[str]) -> str | None:
    """The status-detail note for an overlay build, or None when nothing is left out."""
    skipped = left_out(package_dir, paths)
    if not skipped:
        return None
    shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return (
        f"{len(skipped)} test/doc file(s) outside {package_dir} are not in the overlay image "
        f"({shown})"
    )
