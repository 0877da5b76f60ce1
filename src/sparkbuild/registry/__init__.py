"""Talking to an image registry: the HTTP API client, credentials, and keeping secrets out
of what is printed.

The image stage reads a base image's config through it, the publish stage pushes and moves
aliases through it. Kept apart from both, as docker-py keeps ``auth.py`` and
``credentials/`` apart from its API modules: ``client`` (the registry HTTP API v2),
``credentials`` (environment, stdin or docker's credential store) and ``redact``.
"""

from sparkbuild.registry.client import Manifest, Registry, RegistryClient, get_blob
from sparkbuild.registry.credentials import Credentials
from sparkbuild.registry.redact import Redactor

__all__ = [
    "Credentials",
    "Manifest",
    "Redactor",
    "Registry",
    "RegistryClient",
    "get_blob",
]
