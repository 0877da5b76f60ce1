"""``sparkbuild verify --rebuild``: the command line's part (printing, the exit status)."""

from __future__ import annotations

from sparkbuild import console
from sparkbuild.attest.keys import PublicKey
from sparkbuild.attest.rebuild import rebuild_published
from sparkbuild.errors import NotReproducibleError
from sparkbuild.outputs import emit_json
from sparkbuild.registry.client import RegistryClient
from sparkbuild.settings import Settings


def run_rebuild(
    settings: Settings,
    client: RegistryClient,
    repository: str,
    digest: str,
    public: PublicKey,
    as_json: bool,
) -> None:
    """Rebuild ``repository@digest`` from its signed provenance; exit 1 naming what differs."""
    result = rebuild_published(settings, client, repository, digest, public)
    if as_json:
        emit_json(result.to_json())
    else:
        console.out.print(result.lines(), markup=False)
    if not result.ok:
        raise NotReproducibleError(
            f"{result.reference}: rebuilt from its provenance to {result.rebuilt[:19]}, not the "
            f"published {result.published[:19]}",
            "the image is not what its provenance says it was built from; do not run it "
            "(the differences are listed above)",
        )
