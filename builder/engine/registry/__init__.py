"""The one door to registries (as go-containerregistry splits it): `keychain` finds a host's credentials,
`transport` speaks HTTP to one host (TLS, ping, basic or bearer token per scope, one-line errors),
`operations` reads and writes manifests and blobs, `copy` moves blobs from one registry to another.
No other module opens an HTTP session to a registry; the names below are the public ones."""
from builder.engine.registry.copy import copy_blobs
from builder.engine.registry.keychain import Credential, Keychain, api_host, auth_config
from builder.engine.registry.operations import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    Registry,
    answers,
    get_json,
    mask,
    parse_repository,
    push_blob,
    put_manifest,
    split_repository,
    verify_tag,
)
from builder.engine.registry.transport import TLS, Transport

__all__ = ["INDEX_TYPES", "MANIFEST_TYPES", "TLS", "Credential", "Keychain", "Registry", "Transport", "answers",
           "api_host", "auth_config", "copy_blobs", "get_json", "mask", "push_blob", "put_manifest",
           "parse_repository", "split_repository", "verify_tag"]
