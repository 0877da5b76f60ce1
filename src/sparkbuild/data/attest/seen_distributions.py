"""Every Python distribution the image's interpreters see, as JSON on stdout.

Run by sparkbuild inside an image before its SBOM is signed (``attest/contents.py``), with the
image's ``python3 -I -c``: standard library only, any Python 3.8 or newer. ``argv[1]`` is a
JSON list of the site directories the image's listing found; one whose prefix holds a
``pyvenv.cfg`` belongs to a virtual environment, and that environment's own interpreter is
asked too. Prints ``[{"interpreter": PATH, "distributions": [[NAME, VERSION], ...]}, ...]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ONE = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps([[d.metadata['Name'], d.version] for d in m.distributions()"
    " if d.metadata['Name']]))\n"
)


def venv_interpreters(sites: list[str]) -> list[str]:
    found: set[str] = set()
    for site in sites:
        parts = site.rstrip("/").split("/")
        for end in range(len(parts) - 1, 0, -1):
            root = "/".join(parts[:end]) or "/"
            if os.path.isfile(os.path.join(root, "pyvenv.cfg")):
                for name in ("python3", "python"):
                    path = os.path.join(root, "bin", name)
                    if os.path.isfile(path) and os.access(path, os.X_OK):
                        found.add(path)
                        break
                break
    return sorted(found)


def asked(interpreter: str) -> object:
    done = subprocess.run(
        [interpreter, "-I", "-c", ONE], stdout=subprocess.PIPE, timeout=120, check=True
    )
    return json.loads(done.stdout)


def main() -> None:
    sites = json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
    here = os.path.realpath(sys.executable)
    report = [{"interpreter": sys.executable, "distributions": asked(sys.executable)}]
    for interpreter in venv_interpreters(sites):
        if os.path.realpath(interpreter) != here:
            report.append({"interpreter": interpreter, "distributions": asked(interpreter)})
    print(json.dumps(report))


main()
