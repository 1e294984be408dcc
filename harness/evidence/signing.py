"""Detached signatures of evidence bundles: who vouches for a bundle, not only that it is whole.

`dcpqual verify` proves a bundle is consistent with itself; anyone who rewrites records, reports
and receipt consistently makes a valid bundle. A signature made where the run happened, with a
key only that runner holds, closes that gap. It is detached (the bundle is never rewritten, and
verify refuses files the receipt does not list) and signs `SHA256SUMS`, which covers every other
file, receipt.json included:

- the payload is an in-toto Statement v1 whose subject is SHA256SUMS (by sha256) and whose
  predicate names the receipt's sha256, verdict, status and geometry;
- the envelope is DSSE (payloadType `application/vnd.in-toto+json`), signed over DSSE's
  pre-authentication encoding with an Ed25519 key (PEM, PKCS#8 private / SubjectPublicKeyInfo
  public), from the well-kept `cryptography` package (extra `sign`).

`cosign sign-blob DIR/SHA256SUMS` is the Sigstore alternative for sites that use it; this module
is what can be tested offline.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from harness.atomic import atomic_write_bytes
from harness.errors import UsageError
from harness.evidence.files import sha256_file
from harness.jsonfile import JsonFileRefused, JsonSyntaxError, read_bounded, read_json
from harness.schema.layout import RECEIPT_NAME, SUMS_NAME

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "urn:dcpqual:receipt:v1"
MAX_KEY_BYTES = 64 << 10


def default_signature_path(bundle: Path) -> Path:
    """`<bundle>.sig`, next to the bundle folder (never inside it)."""
    bundle = Path(bundle)
    return bundle.with_name(bundle.name + ".sig")


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        raise UsageError(
            "signatures need the 'cryptography' package: pip install 'dcpqual[sign]'"
        ) from None
    return serialization


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is actually signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()


def _load_key(path: Path, *, private: bool) -> Any:
    """The Ed25519 key (private or public) in a PEM file; anything else is one line."""
    serialization = _crypto()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    data = read_bounded(path, MAX_KEY_BYTES)  # missing, unreadable, not a file: already one line
    try:
        if private:
            key = serialization.load_pem_private_key(data, None)
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        form = "an unencrypted PEM private key" if private else "a PEM public key"
        raise UsageError(f"{path}: not {form}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey if private else Ed25519PublicKey):
        kind = "key" if private else "public key"
        raise UsageError(f"{path}: not an Ed25519 {kind} ({type(key).__name__})")
    return key


def _raw_public(key: Any) -> bytes:
    serialization = _crypto()
    raw: bytes = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


def statement(bundle: Path) -> dict[str, Any]:
    """The in-toto statement a signature of this bundle makes."""
    receipt = read_json(bundle / RECEIPT_NAME)
    if not isinstance(receipt, dict):
        raise UsageError(f"{bundle / RECEIPT_NAME}: not a JSON object")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": SUMS_NAME, "digest": {"sha256": sha256_file(bundle / SUMS_NAME)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "receipt_sha256": sha256_file(bundle / RECEIPT_NAME),
            "verdict": receipt.get("verdict"),
            "status": receipt.get("status"),
            "geometry": receipt.get("geometry"),
        },
    }


def sign_bundle(bundle: Path, key_path: Path, out: Path) -> Path:
    """Write the DSSE envelope for `bundle` to `out`, which must not exist yet."""
    if out.exists() or out.is_symlink():
        raise UsageError(f"{out} already exists; a signature is never overwritten")
    if out.resolve().is_relative_to(Path(bundle).resolve()):
        raise UsageError(f"{out} is inside {bundle}; a detached signature goes outside the bundle")
    key = _load_key(key_path, private=True)
    payload = json.dumps(statement(bundle), sort_keys=True, separators=(",", ":")).encode()
    envelope = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [
            {
                "keyid": _key_id(_raw_public(key.public_key())),
                "sig": base64.b64encode(key.sign(_pae(PAYLOAD_TYPE, payload))).decode(),
            }
        ],
    }
    atomic_write_bytes(out, (json.dumps(envelope, indent=2, sort_keys=True) + "\n").encode())
    return out


def check_signature_inputs(signature: Path, public_key: Path) -> None:
    """Refuse (UsageError) a key or signature file that cannot be read at all, or a missing
    `cryptography`, before any verdict on the bundle: that is bad input, not bad evidence."""
    _load_key(public_key, private=False)
    read_bounded(signature, MAX_KEY_BYTES)


def signature_problems(bundle: Path, signature: Path, public_key: Path) -> list[str]:
    """Why `signature` does not vouch for this very bundle with this key; [] when it does.
    An unreadable key or signature file is a UsageError, never a problem of the bundle."""
    key = _load_key(public_key, private=False)  # first: no `cryptography` is one line, exit 2
    from cryptography.exceptions import InvalidSignature

    name = signature.name
    try:
        envelope = read_json(signature, max_bytes=MAX_KEY_BYTES)
    except JsonFileRefused:
        raise
    except JsonSyntaxError as exc:
        return [f"{name}: not a DSSE envelope: {exc}"]
    try:
        payload_type = envelope["payloadType"]
        payload = base64.b64decode(envelope["payload"], validate=True)
        sigs = [base64.b64decode(s["sig"], validate=True) for s in envelope["signatures"]]
    except (KeyError, TypeError, ValueError) as exc:
        return [f"{name}: not a DSSE envelope: {exc}"]
    if payload_type != PAYLOAD_TYPE:
        return [f"{name}: payloadType is {payload_type!r}, expected {PAYLOAD_TYPE!r}"]
    good = False
    for sig in sigs:
        try:
            key.verify(sig, _pae(payload_type, payload))
        except InvalidSignature:
            continue
        good = True
    if not good:
        return [f"{name}: no signature in it verifies with {public_key}"]
    try:
        signed = json.loads(payload)
    except ValueError as exc:
        return [f"{name}: the signed payload is not JSON: {exc}"]
    expected = statement(bundle)
    problems = []
    for field in ("_type", "predicateType", "subject", "predicate"):
        if signed.get(field) != expected[field]:
            problems.append(
                f"{name}: signed {field} does not match this bundle (its {SUMS_NAME} or "
                f"{RECEIPT_NAME} changed after signing)"
            )
    return problems
