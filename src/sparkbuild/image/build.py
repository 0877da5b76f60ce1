"""The image stage: a prepared source tree into a labelled linux/arm64 image, via BuildKit.

:meth:`ImageJob.start` checks the host first (Docker, BuildKit, the platform and, with
``--locked``, the lock's image entry); the caller then prepares the source (the source
stage) and hands it to ``build_image``, which pins the base image by digest, computes the
inputs digest, and either finds a local image that already carries it (up to date, no
build) or assembles a context (overlay or source) and runs BuildKit. The result is recorded
in images.lock under ``builds.<name>.image``; a failed build leaves the lock alone.
"""

from __future__ import annotations

import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker.errors

from sparkbuild import cachetrust, console, dockerhost, imageref, lockfile, requirements, source
from sparkbuild.errors import (
    BuildFailedError,
    CubinCheckError,
    LocalImageError,
    LockError,
    PlatformError,
    SpecError,
    UnpreparedSourceError,
)
from sparkbuild.image import (
    audit_record,
    base_config,
    base_image,
    builder,
    context,
    cubins,
    labels,
    recheck,
    reproducible,
    source_args,
    tags,
)
from sparkbuild.jsontext import JsonObject
from sparkbuild.settings import Settings
from sparkbuild.source import PreparedSource
from sparkbuild.spec import Build, lapsed_note

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.images import Image

SECTION = "image"
# Build arguments that tune the build without changing what it produces.
_NON_CONTENT_ARGS = frozenset({"MAX_JOBS"})


@dataclass(frozen=True)
class ImageResult:
    build: str
    image_id: str
    repo_digest: str | None
    tags: tuple[str, ...]
    platform: str
    labels: dict[str, str]
    skipped: bool
    seconds: float
    inputs_digest: str
    base_image: str
    base_digest: str
    mode: str
    cuda_code: JsonObject | None = None  # source mode: what the built wheels carry
    reproducible: JsonObject | None = None  # --check-reproducible: the two builds compared
    device_code: JsonObject | None = None  # the device-code audit (image/audit.py)

    def to_json(self) -> JsonObject:
        return {
            "build": self.build,
            "image_id": self.image_id,
            "repo_digest": self.repo_digest,
            "tags": list(self.tags),
            "platform": self.platform,
            "labels": dict(self.labels),
            "skipped": self.skipped,
            "seconds": round(self.seconds, 2),
            "inputs_digest": self.inputs_digest,
            "base_image": self.base_image,
            "base_digest": self.base_digest,
            "mode": self.mode,
            "cuda_code": self.cuda_code,
            "reproducible": self.reproducible,
            "device_code": self.device_code,
        }


@dataclass
class _Plan:
    """Everything decided before building; its parts feed the inputs digest."""

    prepared: PreparedSource
    platform: str
    base: base_image.BaseImage
    dockerfile: context.Dockerfile
    labels: dict[str, str]
    tags: tuple[str, ...]
    build_args: dict[str, str]
    epoch: int
    base_facts: reproducible.BaseFacts
    digest_parts: dict[str, object] = field(default_factory=dict)
    # Extra wheels (images.lock `requirements`) and their files: one more layer when set.
    wheels: list[lockfile.LockedWheel] = field(default_factory=list)
    wheel_files: list[Path] = field(default_factory=list)

    @property
    def inputs_digest(self) -> str:
        return labels.inputs_digest(self.digest_parts)


def _locked_image(build: Build, entry: lockfile.BuildEntry | None) -> lockfile.ImageSection:
    section = entry.image if entry else None
    if section is None or not section.inputs_digest:
        raise LockError(
            f"{build.name}: --locked, but images.lock has no image entry for it",
            f"build it once without --locked (`sparkbuild build {build.name}`) and commit "
            "images.lock",
        )
    return section


def _resolve_base(
    build: Build, api: DockerClient, platform: str, locked: lockfile.ImageSection | None
) -> base_image.BaseImage:
    where = f"base_image of build '{build.name}' in {build.spec_file.name}"
    reference = build.image.base_image
    if not reference and build.image.mode == "source":
        reference = source_args.default_base(build)
    if not reference:
        raise SpecError(
            f"{build.spec_file}: builds.{build.name}.base_image is not set",
            "name the upstream release image to start from, e.g. "
            "`base_image: lmsysorg/sglang:v0.5.12-cu130` (overlay) or a CUDA 13 devel image "
            "(source)",
        )
    if locked is not None:
        locked_ref = locked.base_image or ""
        if imageref.strip_digest(reference) != locked_ref:
            raise LockError(
                f"{build.name}: --locked, but the spec's base image {reference} "
                f"is not the locked {locked_ref}",
                f"`sparkbuild build {build.name}` without --locked re-pins it",
            )
        return base_image.pinned(locked_ref, str(locked.base_digest))
    with console.status(f"{build.name}: resolving {reference}"):
        return base_image.resolve(api, reference, platform, where=where)


def _plan(
    prepared: PreparedSource,
    settings: Settings,
    api: DockerClient,
    platform: str,
    entry: lockfile.BuildEntry | None,
    locked: lockfile.ImageSection | None,
) -> _Plan:
    build = prepared.build
    # e.g. FlashInfer after a bump past its ranges: the build would keep the base image's.
    for name in requirements.lapsed_pins(build, requirements.tree_pyproject(prepared)):
        console.warn(lapsed_note(build, name))
    base = _resolve_base(build, api, platform, locked)
    dockerfile = context.find_dockerfile(build, settings)
    epoch = labels.source_date_epoch(prepared)
    image_labels = labels.image_labels(
        prepared, epoch=epoch, base_ref=base.reference, base_digest=base.digest
    )
    build_args = {"BASE_IMAGE": base.pinned, "SOURCE_DATE_EPOCH": str(epoch)}
    # Both modes build as root and end as the base's own USER (templates, requirements layer).
    facts, build_args["SPARKBUILD_BASE_USER"] = _base(build, base, platform)
    if build.image.mode == "overlay":
        changes = context.overlay_changes(prepared)
        if build.image.install_dir:
            build_args["SPARKBUILD_INSTALL_DIR"] = build.image.install_dir
        helper = context.packaged(context.OVERLAY_HELPER).read_bytes()
        changed: list[list[str]] = sorted([c.path, c.status] for c in changes)
    else:
        build_args |= source_args.source_args(build)
        helper = b""
        changed = []
    build_args |= dict(build.image.build_args)
    plan = _Plan(
        prepared=prepared,
        platform=platform,
        base=base,
        dockerfile=dockerfile,
        labels=image_labels,
        tags=tags.render_tags(build, prepared.tree),
        build_args=build_args,
        epoch=epoch,
        base_facts=facts,
    )
    plan.digest_parts = {
        "mode": build.image.mode,
        "platform": platform,
        "base": base.pinned,
        "tree": prepared.tree,
        "package_dir": build.package_dir,
        "install_dir": build.image.install_dir,
        "changed": changed,
        "dockerfile_sha256": labels.file_digest(dockerfile.read()),
        "helper_sha256": labels.file_digest(helper),
        "build_args": {k: v for k, v in build_args.items() if k not in _NON_CONTENT_ARGS},
        "labels": image_labels,
        "reproducible": reproducible.FORMAT,
    }
    plan.wheels, plan.wheel_files = requirements.image_wheels(
        build, settings, entry, locked=locked is not None
    )
    if plan.wheels:  # only then, so images without requirements keep their digests
        plan.digest_parts["requirements"] = [w.to_json() for w in plan.wheels]
        plan.digest_parts["requirements_layer"] = labels.file_digest(requirements.LAYER.encode())
    return plan


def _base(
    build: Build, base: base_image.BaseImage, platform: str
) -> tuple[reproducible.BaseFacts, str]:
    """What the canonical image keeps of the base, and the base's USER."""
    with console.status(f"{build.name}: reading the config of {base.reference}"):
        config = base_config.full_config(base, platform)
    section = config.get("config")
    user = section.get("User") if isinstance(section, dict) else None
    return reproducible.base_facts(config), str(user or "")


_OVERLAY_LINE = re.compile(r"sparkbuild overlay: (error|hint): (.*?)\s*\Z")


def overlay_failure(build: Build, failure: BuildFailedError) -> BuildFailedError:
    """The overlay helper's own error and hint, as sparkbuild's error (the one error path)."""
    found: dict[str, str] = {}
    for line in failure.log:
        match = _OVERLAY_LINE.search(line)
        if match:
            found.setdefault(match.group(1), match.group(2).strip())
    if "error" not in found:
        return failure
    hint = found.get("hint") or failure.hint or ""
    return BuildFailedError(
        f"{build.name}: the build failed: overlay: {found['error']}\n{failure.message}",
        f"{hint}; images.lock was not changed" if hint else "images.lock was not changed",
        log=failure.log,
    )


def _explain_locked_difference(plan: _Plan, locked: lockfile.ImageSection) -> str:
    differences = []
    for key, now in (
        ("tree", plan.prepared.tree),
        ("platform", plan.platform),
        ("mode", plan.prepared.build.image.mode),
    ):
        if getattr(locked, key) not in (None, now):
            differences.append(f"{key}: locked {getattr(locked, key)}, now {now}")
    if not differences:
        differences.append("build arguments, Dockerfile or labels changed")
    return "; ".join(differences)


def find_local(api: DockerClient, digest: str) -> Image | None:
    """The newest local image labelled with ``digest``, if any."""
    images = api.images.list(filters={"label": f"{labels.INPUTS_LABEL}={digest}"})
    if not images:
        return None
    return max(images, key=lambda image: str(image.attrs.get("Created", "")))


BuildTimes = tuple[datetime, datetime]  # when an image's build started and finished


def _build_times(job: ImageJob, image_id: str, skipped: bool) -> BuildTimes | None:
    """This run's, for an image it built. An up-to-date image was built by an earlier run:
    that run's times, when the lock recorded them for this very image, else none (this run
    built nothing, so its own times would be a lie)."""
    if not skipped:
        return job.started_at, datetime.now(tz=UTC)
    pinned = job.entry.image if job.entry else None
    return pinned.build_times() if pinned is not None and pinned.image_id == image_id else None


def _lock_section(
    plan: _Plan, image: Image, cuda_code: dict[str, Any] | None, times: BuildTimes | None
) -> lockfile.ImageSection:
    section = lockfile.ImageSection(
        mode=plan.prepared.build.image.mode,
        base_image=plan.base.reference,
        base_digest=plan.base.digest,
        platform=plan.platform,
        tree=plan.prepared.tree,
        inputs_digest=plan.inputs_digest,
        image_id=str(image.id),
        repo_digest=tags.repo_digest(image),
        tags=list(plan.tags),
        source_date_epoch=plan.epoch,
    )
    if cuda_code is not None:  # source mode only, so overlay entries keep their shape
        section.cuda_code = cuda_code
    if times is not None:
        section.set_build_times(*times)
    return section


def _verify_cuda_code(plan: _Plan, api: DockerClient, image: Image) -> JsonObject | None:
    """Source mode: the built wheels' cubins match TORCH_CUDA_ARCH_LIST, or the image goes."""
    if plan.prepared.build.image.mode != "source":
        return None
    arch_list = plan.build_args.get("TORCH_CUDA_ARCH_LIST", "")
    with console.status(f"{plan.prepared.build.name}: checking the cubins of the built wheels"):
        try:
            code = cubins.verify(api, image, plan.platform, arch_list)
        except CubinCheckError as failure:
            api.images.remove(str(image.id), force=True)
            raise CubinCheckError(
                f"{plan.prepared.build.name}: {failure.message}", failure.hint
            ) from None
    return code.to_json() if code is not None else None


def _check_platform(image: Image, platform: str) -> None:
    arch = dockerhost.platform_arch(platform)
    got = f"{image.attrs.get('Os')}/{image.attrs.get('Architecture')}"
    if image.attrs.get("Architecture") != arch:
        raise PlatformError(
            f"the build produced a {got} image, not {platform}",
            "BuildKit ignored --platform: update the docker client or use `--builder NAME`",
        )


def _run_build(plan: _Plan, job: ImageJob, *, again: bool = False) -> str:
    """Run BuildKit; the built image's id (not yet in its reproducible form). ``again``: the
    reproducibility check's second build, without the cache, untagged, in another directory."""
    build, options, client = plan.prepared.build, job.options, job.client
    build_args = dict(plan.build_args)
    if (
        build.image.mode == "source"
        and "MAX_JOBS" not in build_args
        and options.builder_name is None
    ):
        build_args["MAX_JOBS"] = str(builder.daemon_max_jobs(job.api))
    # Private (cachetrust): another user who could rename entries here could swap the
    # context the image is built from.
    folder = "contexts-again" if again else "contexts"
    work_root = cachetrust.private_dir(job.settings.cache_dir / folder, "the context cache")
    with tempfile.TemporaryDirectory(dir=work_root, prefix=f"{build.name}-") as tmp:
        context_dir = Path(tmp) / "context"
        context_dir.mkdir()
        if build.image.mode == "overlay":
            context.write_overlay_context(plan.prepared, context_dir, build.image.install_dir)
        else:
            context.write_source_context(plan.prepared, context_dir)
        dockerfile = plan.dockerfile.path
        if plan.wheels:
            requirements.write_context(context_dir, plan.wheels, plan.wheel_files)
            dockerfile = Path(tmp) / "Dockerfile"
            dockerfile.write_bytes(requirements.dockerfile_with_layer(plan.dockerfile.read()))
        request = builder.BuildRequest(
            context=context_dir,
            dockerfile=dockerfile,
            platform=plan.platform,
            build_args=build_args,
            labels={**plan.labels, labels.INPUTS_LABEL: plan.inputs_digest},
            tags=() if again else plan.tags,
            no_cache=options.no_cache or again,
            builder=options.builder_name,
            cache_from=job.cache[0],
            cache_to=job.cache[1],
        )
        console.info(
            f"{build.name}: building {build.image.mode} image for {plan.platform} "
            f"with {client.describe()}"
        )
        try:
            return builder.run_build(client, request, stream=builder.stream_progress())
        except BuildFailedError as failure:
            if build.image.mode == "overlay":
                raise overlay_failure(build, failure) from None
            raise


@dataclass(frozen=True)
class BuildOptions:
    """How every build of one command is built (frozen, given once, like cibuildwheel's
    options): ``cache_from``/``cache_to`` name registry build caches, and ``{build}`` in them
    becomes the build's name, so each build keeps its own cache."""

    locked: bool = False  # build exactly what images.lock pins
    platform: str | None = None  # overrides the spec's
    builder_name: str | None = None  # a docker buildx builder
    no_cache: bool = False
    cache_from: tuple[str, ...] = ()
    cache_to: str | None = None
    check_reproducible: bool = False  # build again without the cache and compare


@dataclass(frozen=True)
class ImageJob:
    """One build's image job, checked before its source is prepared: the Docker daemon, a
    BuildKit client, the target platform, the cache references and, with ``--locked``, the
    lock's image entry. So a missing daemon or entry fails before any clone or fetch."""

    build: Build
    settings: Settings
    options: BuildOptions
    lock: lockfile.LockHandle  # the command's; the build's entry is written once, at the end
    api: DockerClient
    client: builder.BuildClient
    platform: str
    cache: tuple[tuple[str, ...], str | None]
    entry: lockfile.BuildEntry | None
    locked: lockfile.ImageSection | None
    started: float  # time.monotonic() when the job started: the build's seconds count from here
    started_at: datetime  # the same moment on the clock (UTC), for images.lock

    @classmethod
    def start(
        cls,
        build: Build,
        settings: Settings,
        options: BuildOptions = BuildOptions(),
        *,
        lock: lockfile.LockHandle | None = None,
    ) -> ImageJob:
        """Check what building ``build`` needs; ``lock`` is the command's lock handle (else
        one is opened)."""
        started, started_at = time.monotonic(), datetime.now(tz=UTC)
        cache = builder.cache_refs(options.cache_from, options.cache_to, build.name)
        api = dockerhost.client()
        client = builder.find_client(need_buildx=options.builder_name is not None)
        lock = lock or lockfile.LockHandle.open(settings.lock_file)
        entry = lock.entry(build.name)
        locked_section = _locked_image(build, entry) if options.locked else None
        target = options.platform or build.image.platform
        if locked_section is not None and locked_section.platform not in (None, target):
            raise LockError(
                f"{build.name}: --locked, but the lock pins platform {locked_section.platform}, "
                f"not {target}",
                "drop --platform, or rebuild without --locked",
            )
        dockerhost.platform_arch(target)
        return cls(
            build=build,
            settings=settings,
            options=options,
            lock=lock,
            api=api,
            client=client,
            platform=target,
            cache=cache,
            entry=entry,
            locked=locked_section,
            started=started,
            started_at=started_at,
        )


def build_image(prepared: PreparedSource, job: ImageJob) -> ImageResult:
    """Build (or find up to date) one build's image from its prepared source, and record the
    source and the image in images.lock together, once, at the end. The caller prepares the
    source after :meth:`ImageJob.start` (with ``locked=job.options.locked``)."""
    build = job.build
    if prepared.build.name != build.name:
        raise ValueError(f"the source of {prepared.build.name} given to the job of {build.name}")
    _refuse_failing(prepared)
    if build.image.mode == "overlay":
        context.overlay_changes(prepared)  # refuse non-Python changes before any other work
    plan = _plan(prepared, job.settings, job.api, job.platform, job.entry, job.locked)
    if job.locked is not None and plan.inputs_digest != job.locked.inputs_digest:
        raise LockError(
            f"{build.name}: --locked, but the image inputs differ from images.lock "
            f"({_explain_locked_difference(plan, job.locked)})",
            f"`sparkbuild build {build.name}` without --locked rebuilds and re-pins it",
        )
    image, skipped = _local_or_built(plan, job)
    cuda_code = _verify_cuda_code(plan, job.api, image)
    earlier = job.entry.image.device_code if job.entry and job.entry.image else None
    device_code = audit_record.audit_build(job.api, build, str(image.id), earlier)
    times = _build_times(job, str(image.id), skipped)
    checked = _check_reproducible(plan, job, image)
    section = _lock_section(plan, image, cuda_code, times)
    facts = None if skipped else _builder_facts(plan, job)
    pinned = job.entry.image if job.entry else None
    recheck.record_into(section, check=checked, builder=facts, pinned=pinned)
    if not job.options.locked:
        source.record(prepared, job.lock)
    section.device_code = dict(device_code)
    job.lock.set_section(build.name, section)
    job.lock.write()  # source and image together, once
    if checked is not None and not checked.reproducible:
        raise recheck.not_reproducible(build.name, checked)
    return ImageResult(
        build=build.name,
        image_id=str(image.id),
        repo_digest=tags.repo_digest(image),
        tags=plan.tags,
        platform=job.platform,
        labels={str(k): str(v) for k, v in (image.labels or {}).items()},
        skipped=skipped,
        seconds=time.monotonic() - job.started,
        inputs_digest=plan.inputs_digest,
        base_image=plan.base.reference,
        base_digest=plan.base.digest,
        mode=build.image.mode,
        cuda_code=cuda_code,
        reproducible=checked.to_json() if checked is not None else None,
        device_code=device_code,
    )


def _check_reproducible(
    plan: _Plan, job: ImageJob, image: Image
) -> recheck.ReproducibleCheck | None:
    if not job.options.check_reproducible:
        return None
    console.info(f"{job.build.name}: checking reproducibility: a second build without the cache")
    return recheck.check(
        job.api,
        image,
        lambda: _build_again(plan, job),
        plan.base_facts,
        plan.epoch,
        job.settings.cache_dir / "reproducible",
    )


def _builder_facts(plan: _Plan, job: ImageJob) -> dict[str, str]:
    engine = str(job.api.version().get("Version") or "?")
    facts = builder.builder_facts(
        job.client, f"Docker Engine {engine}", job.options.builder_name, plan.dockerfile.read()
    )
    return {**facts, "canonical_form": str(reproducible.FORMAT)}


def _refuse_failing(prepared: PreparedSource) -> None:
    if prepared.ok:
        return
    build = prepared.build
    failing = [
        f"{i.id}: {i.status} ({i.detail})" for i in prepared.items if i.status in source.FAILING
    ]
    raise UnpreparedSourceError(
        f"{build.name}: the source does not prepare cleanly:\n  " + "\n  ".join(failing),
        f"`sparkbuild patches {build.name}` shows every item; "
        f"`sparkbuild prepare {build.name}` checks out the tree to fix it",
    )


def _local_or_built(plan: _Plan, job: ImageJob) -> tuple[Image, bool]:
    """The local image that already carries the inputs digest (skipped), else a new build."""
    build, api = job.build, job.api
    existing = None if job.options.no_cache else find_local(api, plan.inputs_digest)
    if existing is not None:
        tags.ensure_tags(existing, plan.tags)
        image = api.images.get(str(existing.id))
        console.info(f"{build.name}: up to date ({str(image.id)[:19]})")
        return image, True
    if job.options.builder_name is None:
        dockerhost.check_can_run(job.platform)
    image = _built_image(api, build, _run_build(plan, job))
    _check_platform(image, job.platform)
    with reproducible.workdir(job.settings.cache_dir / "reproducible") as work:
        canonical = reproducible.make_reproducible(
            api, str(image.id), plan.base_facts, plan.epoch, plan.tags, work
        )
    return api.images.get(canonical.image_id), False


def _built_image(api: DockerClient, build: Build, image_id: str) -> Image:
    try:
        return api.images.get(image_id)
    except docker.errors.ImageNotFound as exc:
        raise LocalImageError(
            f"{build.name}: the built image {image_id} is not in the local store",
            "with a remote --builder, check that `docker buildx build --load` works",
        ) from exc


def _build_again(plan: _Plan, job: ImageJob) -> Image:
    """The reproducibility check's second build (see :mod:`sparkbuild.image.recheck`)."""
    return _built_image(job.api, job.build, _run_build(plan, job, again=True))


__all__ = ["BuildOptions", "ImageJob", "ImageResult", "build_image"]
