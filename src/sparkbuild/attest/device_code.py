"""The device-code audit in what is signed: properties of the SBOM's components, read back
by ``verify`` (docs/verify.md).

Each component whose files carry CUDA code gets ``sparkbuild:sm121:verdict`` (native,
ptx, none, jit), ``:sass``, ``:ptx``, ``:loaded`` and, where it compiles at run time,
``:compiles``; the document itself says which audit it carries
(``sparkbuild:sm121:audit``: the counts, the image id). ``verify`` turns the signed SBOM's
properties into the ``device-code`` finding: it fails when a library the launch loads has
no code for sm_121 (an image that should never have been built).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cyclonedx.model import Property
from cyclonedx.model.component import Component
from packaging.utils import canonicalize_name

KEY = "sparkbuild:sm121"


def _libraries(record: Mapping[str, object]) -> list[Mapping[str, object]]:
    found = record.get("libraries")
    return [lib for lib in found if isinstance(lib, Mapping)] if isinstance(found, list) else []


def _owner(library: Mapping[str, object]) -> tuple[str, str]:
    kind, name = str(library.get("kind", "")), str(library.get("name", ""))
    return kind, str(canonicalize_name(name)) if kind == "python" else name


def _words(value: object) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else ""


def library_properties(library: Mapping[str, object]) -> list[Property]:
    values = {
        "verdict": str(library.get("verdict", "")),
        "loaded": "true" if library.get("loaded") else "false",
        "sass": _words(library.get("sass")),
        "ptx": _words(library.get("ptx")),
        "compiles": str(library.get("compiles") or ""),
    }
    return [Property(name=f"{KEY}:{k}", value=v) for k, v in values.items() if v]


def add_properties(
    components: Iterable[Component], record: Mapping[str, object] | None
) -> list[Property]:
    """Each audited library's properties onto its component (Python distributions by
    name, Debian packages by package); the document's own audit property, returned."""
    if not record:
        return []
    by_owner = {_owner(lib): lib for lib in _libraries(record)}
    for component in components:
        purl = component.purl
        kind = {"pypi": "python", "deb": "deb"}.get(purl.type if purl else "", "")
        name = str(canonicalize_name(component.name)) if kind == "python" else component.name
        library = by_owner.get((kind, name))
        if library is not None:
            for prop in library_properties(library):
                component.properties.add(prop)
    counts = record.get("counts")
    shown = ", ".join(f"{k} {v}" for k, v in counts.items()) if isinstance(counts, Mapping) else ""
    return [Property(name=f"{KEY}:audit", value=f"{record.get('image_id')}: {shown}")]


def _properties(item: Mapping[str, object]) -> dict[str, str]:
    found = item.get("properties")
    listed = found if isinstance(found, list) else []
    return {
        str(p.get("name")): str(p.get("value"))
        for p in listed
        if isinstance(p, Mapping) and str(p.get("name", "")).startswith(KEY)
    }


def check_device_code(sbom: Mapping[str, object] | None) -> tuple[bool, str]:
    """(ok, detail) of the ``device-code`` finding, from the verified SBOM's properties."""
    if sbom is None:
        return False, "no verified SBOM"
    metadata = sbom.get("metadata")
    audit = _properties(metadata if isinstance(metadata, Mapping) else {}).get(f"{KEY}:audit")
    if audit is None:
        return True, "not recorded (published before the audit)"
    components = sbom.get("components")
    failing = []
    for item in components if isinstance(components, list) else []:
        if not isinstance(item, Mapping):
            continue
        props = _properties(item)
        if props.get(f"{KEY}:verdict") == "none" and props.get(f"{KEY}:loaded") == "true":
            failing.append(f"{item.get('name')} (SASS {props.get(f'{KEY}:sass', '-')})")
    if failing:
        return False, f"loaded with no sm_121 code: {', '.join(failing[:10])}"
    return True, f"sm_121 audit {audit}"
