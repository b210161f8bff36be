"""Checking the router's signature on a warrant (contract 5.4), so that only the router's own answer is taken.

When the seat is given the router's ed25519 public key (`Config.router_key`), a warrant is taken only when its
`sig` is the router's signature over the warrant itself: the warrant as JSON without `sig`, with sorted keys, no
spaces, UTF-8 (the same canonical form as the act digest of 5.4). The JSON is the warrant as the contract's record
encodes it (kebab-case, empty optional fields left out, section 1), so a router signs what it writes. Where the
warrant as the router wrote it is at hand (the object in its record), that is what is checked, every field and
every spelling as written, so a field this seat does not know or a time written another way still verifies.

Pure: no I/O, no clock. `warrant_signature_why` answers "" when the signature holds, else a sentence an operator can
act on; `make_verify` is that check bound to one configured key, as `rules.retire.decide` takes it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from mesh_provisioner.messages import records as r

KEY_BYTES: Final = 32
SIGNATURE_BYTES: Final = 64


class BadRouterKey(ValueError):
    """A router key that is not an ed25519 public key in base64 or hex."""


Signed = r.Warrant | Mapping[str, Any]
"""A warrant as decoded, or as the router wrote it (the JSON object of its record)."""


def signed_bytes(warrant: Signed) -> bytes:
    """What the router signs: the warrant without `sig`, as JSON with sorted keys, no spaces, UTF-8 (5.4)."""
    body: dict[str, Any] = dict(warrant) if isinstance(warrant, Mapping) else msgspec.to_builtins(warrant)
    body.pop("sig", None)
    return r.canonical_json(body)


def _b64(text: str) -> bytes:
    """Bytes of base64 text, standard or URL-safe, padded or not; raises ValueError when it is not base64."""
    text = text.strip()
    padded = text + "=" * (-len(text) % 4)
    alt = b"-_" if ("-" in text or "_" in text) else None
    try:
        return base64.b64decode(padded, altchars=alt, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError(str(err)) from None


def parse_key(text: str) -> Ed25519PublicKey:
    """The router's public key from its 32 raw bytes in base64 (or in hex); raises BadRouterKey saying why not."""
    text = text.strip()
    if not text:
        raise BadRouterKey("the router's key is empty")
    raw: bytes | None = None
    if len(text) == 2 * KEY_BYTES:
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = None
    if raw is None:
        try:
            raw = _b64(text)
        except ValueError:
            raise BadRouterKey("the router's key is neither base64 nor hex") from None
    if len(raw) != KEY_BYTES:
        raise BadRouterKey(f"the router's key is {len(raw)} bytes, not the {KEY_BYTES} of an ed25519 public key")
    return Ed25519PublicKey.from_public_bytes(raw)


def check(warrant: Signed, key: Ed25519PublicKey) -> str:
    """Why a warrant's signature does not hold under a parsed key; "" when it is the key's signature (5.4)."""
    written = warrant.get("sig", "") if isinstance(warrant, Mapping) else warrant.sig
    if not written:
        return "the warrant is not signed, and the seat takes only warrants the router signed"
    if not isinstance(written, str):
        return "the warrant's signature is not base64"
    try:
        sig = _b64(written)
    except ValueError:
        return "the warrant's signature is not base64"
    if len(sig) != SIGNATURE_BYTES:
        return f"the warrant's signature is {len(sig)} bytes, not the {SIGNATURE_BYTES} of an ed25519 signature"
    try:
        key.verify(sig, signed_bytes(warrant))
    except InvalidSignature:
        return (
            "the warrant's signature does not verify with the router's key: the router did not sign it, "
            "or it was changed since"
        )
    return ""


def warrant_signature_why(warrant: Signed, public_key: str) -> str:
    """Why a warrant is not signed by the router whose key is given (base64 or hex); "" when it is (5.4)."""
    try:
        key = parse_key(public_key)
    except BadRouterKey as err:
        return f"the router's key is not valid: {err}"
    return check(warrant, key)


def make_verify(router_key: str) -> Callable[[Signed], str]:
    """The check `rules.retire.decide` takes as `verify`, bound to the configured router key (`Config.router_key`).

    The key is read once. A key that is not valid refuses every warrant, saying so: a seat told to check
    signatures never takes an unchecked one.
    """
    try:
        key = parse_key(router_key)
    except BadRouterKey as err:
        why = f"the router's key is not valid: {err}"
        return lambda _warrant: why
    return lambda warrant: check(warrant, key)
