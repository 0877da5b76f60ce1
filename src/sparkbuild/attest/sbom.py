"""The image's SBOM: a CycloneDX 1.6 document made with cyclonedx-python-lib's model and
checked with its strict JSON validator.

Components:

- each installed OS package (``pkg:deb/<os>/<name>@<version>?arch=…&distro=<os>-<version>``);
- each Python distribution of each site-packages directory (``pkg:pypi/<name>@<version>``),
  its hash the SHA-256 of its ``RECORD`` where that lists the files' own hashes (so the
  one hash pins every installed file), and the directory as a property;
- the patched engine, a component of its own with its pedigree: the upstream commit it was
  built from (the ancestor), every PR (a cherry-pick, by URL and head) and every patch of
  ours (unofficial), each with its sha256 as a property;
- the device-code audit of the image (images.lock's ``image.device_code``), as properties
  of each component whose files carry CUDA code (``attest/device_code``).

The document's subject, the image, is its metadata component (``pkg:oci``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import jsonschema.validators
from cyclonedx.model import HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import (
    Commit,
    Component,
    ComponentType,
    Diff,
    Patch,
    PatchClassification,
    Pedigree,
)
from cyclonedx.model.dependency import Dependency
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from packageurl import PackageURL
from packaging.utils import canonicalize_name

from sparkbuild import __version__, lockfile
from sparkbuild.attest.contents import ImageContents, OsPackage, PythonDistribution
from sparkbuild.attest.device_code import add_properties
from sparkbuild.errors import PublishError

PROPERTY = "sparkbuild"


@dataclass(frozen=True)
class Sbom:
    document: dict[str, Any]
    packages: int  # OS packages + Python distributions (the engine component not counted)


def _os_component(package: OsPackage, contents: ImageContents) -> Component:
    qualifiers = {"arch": package.architecture} if package.architecture else {}
    if contents.os_version:
        qualifiers["distro"] = f"{contents.os_id}-{contents.os_version}"
    purl = PackageURL(
        type="deb",
        namespace=contents.os_id,
        name=package.name,
        version=package.version,
        qualifiers=qualifiers,
    )
    properties = (
        [Property(name=f"{PROPERTY}:source", value=package.source)] if package.source else []
    )
    return Component(
        name=package.name,
        version=package.version,
        purl=purl,
        bom_ref=f"deb:{package.name}:{package.architecture}",
        type=ComponentType.LIBRARY,
        properties=properties,
    )


def _python_component(dist: PythonDistribution) -> Component:
    name = canonicalize_name(dist.name)
    hashes = (
        [HashType(alg=HashAlgorithm.SHA_256, content=dist.record_sha256)]
        if dist.record_sha256
        else []
    )
    properties = [Property(name=f"{PROPERTY}:site-packages", value=dist.site)]
    if dist.record_sha256:
        properties.append(Property(name=f"{PROPERTY}:hash-of", value="RECORD"))
        properties.append(
            Property(name=f"{PROPERTY}:record-hashed-files", value=str(dist.hashed_files))
        )
    return Component(
        name=dist.name,
        version=dist.version,
        purl=PackageURL(type="pypi", name=name, version=dist.version),
        bom_ref=f"pypi:{dist.site}:{name}",
        hashes=hashes,
        properties=properties,
    )


def _upstream_purl(engine: str, repo: str, commit: str) -> PackageURL:
    if repo.startswith("https://github.com/"):
        owner, _, name = (
            repo.removeprefix("https://github.com/").removesuffix(".git").partition("/")
        )
        return PackageURL(type="github", namespace=owner, name=name, version=commit)
    return PackageURL(
        type="generic", name=engine, version=commit, qualifiers={"vcs_url": f"git+{repo}@{commit}"}
    )


def _engine_component(build: str, entry: lockfile.BuildEntry) -> Component:
    source = entry.source or lockfile.SourceSection()
    engine, repo = str(source.engine or "engine"), str(source.repo or "")
    commit = str(source.commit or "")
    base = repo.removesuffix(".git")
    properties = [Property(name=f"{PROPERTY}:build", value=build)]
    if source.tree:
        properties.append(Property(name=f"{PROPERTY}:tree", value=source.tree))
    patches = []
    for pr in source.prs:
        patches.append(
            Patch(
                type=PatchClassification.CHERRY_PICK,
                diff=Diff(url=XsUri(f"{base}/pull/{pr.number}")),
            )
        )
        for key, value in (
            ("head", pr.head),
            ("diff-sha256", pr.diff_sha256),
            ("status", pr.status),
        ):
            if value:
                properties.append(Property(name=f"{PROPERTY}:pr:{pr.number}:{key}", value=value))
    for patch in source.patches:
        patches.append(
            Patch(
                type=PatchClassification.UNOFFICIAL,
                diff=Diff(url=XsUri(f"file:{quote(patch.file)}")),
            )
        )
        for key, value in (("sha256", patch.sha256), ("status", patch.status)):
            if value:
                properties.append(
                    Property(name=f"{PROPERTY}:patch:{patch.file}:{key}", value=value)
                )
    ancestor = Component(
        name=engine,
        version=str(source.version or ""),
        purl=_upstream_purl(engine, repo, commit),
        bom_ref="engine-upstream",
    )
    commits = (
        [Commit(uid=commit, url=XsUri(f"{base}/commit/{commit}"))]
        if commit and base.startswith("http")
        else [Commit(uid=commit)]
    )
    pedigree = Pedigree(
        ancestors=[ancestor],
        commits=commits,
        patches=patches,
        notes=f"{engine} {source.version} at {commit[:12]} with "
        f"{len(source.prs)} PR(s) and {len(source.patches)} patch(es)",
    )
    version = f"{source.version}+sparkbuild.{str(source.tree or '')[:12]}"
    return Component(
        name=engine,
        version=version,
        type=ComponentType.APPLICATION,
        bom_ref="engine",
        pedigree=pedigree,
        properties=properties,
    )


def _image_component(name: str, digest: str) -> Component:
    host_path = name.rsplit("/", 1)
    purl = PackageURL(
        type="oci", name=host_path[-1], version=digest, qualifiers={"repository_url": name}
    )
    return Component(
        name=name, version=digest, type=ComponentType.CONTAINER, purl=purl, bom_ref="image"
    )


def _depends_on_all(root: Component, components: list[Component]) -> list[Dependency]:
    """The graph ``Bom.register_dependency`` makes (the root on each component, each on
    nothing), made directly: that call searches every dependency for each one it adds, and a
    real image's 700 components took seconds."""
    each = [Dependency(ref=component.bom_ref) for component in components]
    return [Dependency(ref=root.bom_ref, dependencies=each), *each]


def _canonical(value: object) -> object:
    """``value`` as JSON Schema compares it: 1 and 1.0 are the same number."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return value


def _unique_items(
    validator: Validator, unique: object, instance: object, schema: object
) -> Iterator[ValidationError]:
    """JSON Schema's ``uniqueItems`` by a set of canonical JSON texts: jsonschema's own
    compares every pair of objects, and the SBOM's components took seconds."""
    if not unique or not isinstance(instance, list):
        return
    seen: set[str] = set()
    for item in instance:
        key = json.dumps(_canonical(item), sort_keys=True)
        if key in seen:
            yield ValidationError(f"non-unique element: {key[:200]}")
            return
        seen.add(key)


@functools.cache
def _validator() -> Validator:
    """cyclonedx-python-lib's strict CycloneDX 1.6 validator (its schema, registry and format
    checker), with a ``uniqueItems`` that is linear in the items, made once."""
    strict = JsonStrictValidator(SchemaVersion.V1_6)._validator
    extend = jsonschema.validators.extend  # untyped in the stubs
    linear = extend(type(strict), {"uniqueItems": _unique_items})  # type: ignore[no-untyped-call]
    made: Validator = linear(
        strict.schema,
        registry=getattr(strict, "_registry"),  # noqa: B009 - the validator's own, not in the protocol
        format_checker=getattr(strict, "format_checker"),  # noqa: B009 - as above
    )
    return made


def build_sbom(
    contents: ImageContents, build: str, entry: lockfile.BuildEntry, image_name: str, digest: str
) -> Sbom:
    """The CycloneDX document of the image ``image_name@digest``, validated."""
    components = [_engine_component(build, entry)]
    components += [_os_component(package, contents) for package in contents.packages]
    components += [_python_component(dist) for dist in contents.distributions]
    audited = add_properties(components, entry.image.device_code if entry.image else None)
    bom = Bom(
        components=components,
        metadata=BomMetaData(
            component=_image_component(image_name, digest),
            properties=[Property(name=f"{PROPERTY}:version", value=__version__), *audited],
        ),
    )
    root = bom.metadata.component
    if root is not None:  # the image depends on everything in it
        bom.dependencies = _depends_on_all(root, components)
    text = JsonV1Dot6(bom).output_as_string()
    error = next(_validator().iter_errors(json.loads(text)), None)
    if error is not None:
        raise PublishError(
            f"{build}: the SBOM does not validate as CycloneDX 1.6 ({str(error)[:300]}); "
            "nothing was signed",
            "this is a sparkbuild bug; report it with the image's distribution list",
        )
    document: dict[str, object] = json.loads(text)
    return Sbom(document, len(contents.packages) + len(contents.distributions))
