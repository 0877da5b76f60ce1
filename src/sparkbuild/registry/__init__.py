"""Talking to an image registry: the HTTP API client, credentials, and keeping secrets out
of what is printed.

The image stage reads a base image's config through it, the publish stage pushes and moves
aliases through it. Kept apart from both, as docker-py keeps ``auth.py`` and
``credentials/`` apart from its API modules: ``client`` (the registry HTTP API v2) and
``credentials`` (environment, stdin or docker's credential store). Secrets are kept out of
what is printed by :mod:`sparkbuild.redact`, which every stage uses.
"""

from sparkbuild.redact import Redactor
from sparkbuild.registry.address import Manifest, Registry
from sparkbuild.registry.client import RegistryClient, get_blob
from sparkbuild.registry.credentials import Credentials

__all__ = [
    "Credentials",
    "Manifest",
    "Redactor",
    "Registry",
    "RegistryClient",
    "get_blob",
]
