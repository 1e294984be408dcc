"""Detached Ed25519 signatures through the real CLI: `dcpqual sign`, `dcpqual verify --signature`.

A signature vouches for one bundle by one key: the same bundle checks out, a bundle edited and
resealed after signing does not (verify alone would call it valid), another key does not, and
nothing is ever written into the bundle or over an existing signature.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from _support.evidence_factory import passing_run
from _support.forge import reseal
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from harness.cli import main
from harness.evidence.writer import finalize_bundle


def write_key(folder: Path, name: str, key: PrivateKeyTypes | None = None) -> tuple[Path, Path]:
    """(private, public) PEM files of `key`, a new Ed25519 key by default."""
    key = key or Ed25519PrivateKey.generate()
    private = folder / f"{name}.pem"
    public = folder / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("signed") / "bundle"
    finalize_bundle(out, passing_run(out, world=2))
    return out


@pytest.fixture
def signed(pristine: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(bundle, signature, public key) of a freshly signed copy."""
    bundle = tmp_path / "bundle"
    shutil.copytree(pristine, bundle)
    private, public = write_key(tmp_path, "runner")
    before = sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*"))
    assert main(["sign", str(bundle), "--key", str(private)]) == 0
    assert sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*")) == before
    return bundle, tmp_path / "bundle.sig", public


def verify_signed(bundle: Path, signature: Path, public: Path) -> int:
    return main(["verify", str(bundle), "--signature", str(signature), "--public-key", str(public)])


def test_a_signed_bundle_verifies_with_its_key(
    signed: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, signature, public = signed
    envelope = json.loads(signature.read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert verify_signed(bundle, signature, public) == 0
    assert "valid (signed" in capsys.readouterr().out


def test_a_bundle_edited_and_resealed_after_signing_fails(
    signed: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, signature, public = signed
    log = bundle / "torchrun" / "run-1" / "attempt_0" / "0" / "stdout.log"
    log.write_text("rewritten after the run\n")
    receipt = json.loads((bundle / "receipt.json").read_text())
    receipt["files"][log.relative_to(bundle).as_posix()] = hashlib.sha256(
        log.read_bytes()
    ).hexdigest()
    (bundle / "receipt.json").write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")
    reseal(bundle)
    assert main(["verify", str(bundle)]) == 0  # consistent with itself: only the key can tell
    capsys.readouterr()
    assert verify_signed(bundle, signature, public) == 1
    assert "bundle.sig: signed subject does not match this bundle" in capsys.readouterr().out


def test_another_key_does_not_verify(
    signed: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, signature, _ = signed
    _, other = write_key(tmp_path, "other")
    assert verify_signed(bundle, signature, other) == 1
    assert "no signature in it verifies" in capsys.readouterr().out


def test_a_tampered_envelope_does_not_verify(
    signed: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, signature, public = signed
    envelope = json.loads(signature.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["verdict"] = "fail"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    signature.write_text(json.dumps(envelope))
    assert verify_signed(bundle, signature, public) == 1
    assert "no signature in it verifies" in capsys.readouterr().out


def test_sign_refuses_to_overwrite_or_to_sign_an_invalid_bundle(
    signed: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, signature, _ = signed
    private, _ = write_key(tmp_path, "again")
    first = signature.read_bytes()
    capsys.readouterr()
    assert main(["sign", str(bundle), "--key", str(private)]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert signature.read_bytes() == first
    (bundle / "summary.md").write_text("edited\n")
    assert main(["sign", str(bundle), "--key", str(private), "--out", str(tmp_path / "x")]) == 2
    assert "is not a valid bundle" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_signature_options_go_together(
    signed: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, signature, _ = signed
    assert main(["verify", str(bundle), "--signature", str(signature)]) == 2
    assert "go together" in capsys.readouterr().err


def test_sign_refuses_to_write_the_signature_inside_the_bundle(
    signed: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, _, _ = signed
    private, _ = write_key(tmp_path, "inside")
    capsys.readouterr()
    for out in (bundle / "bundle.sig", bundle / "records" / ".." / "x.sig"):
        assert main(["sign", str(bundle), "--key", str(private), "--out", str(out)]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert "is inside" in line and "outside the bundle" in line
        assert not out.exists()
    assert main(["verify", str(bundle)]) == 0  # the bundle is untouched and still whole


@pytest.mark.parametrize("edited", [False, True], ids=["valid-bundle", "invalid-bundle"])
@pytest.mark.parametrize(
    "which, path",
    [
        ("signature", "missing.sig"),
        ("signature", "."),
        ("signature", "/dev/zero"),
        ("public-key", "missing.pem"),
        ("public-key", "."),
    ],
)
def test_an_unreadable_signature_or_key_is_bad_input_whatever_the_bundle(
    signed: tuple[Path, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    which: str,
    path: str,
    edited: bool,
) -> None:
    bundle, signature, public = signed
    if edited:
        (bundle / "summary.md").write_text("edited\n")
    unusable = Path(path) if path.startswith("/") else tmp_path / path
    given = {"signature": signature, "public-key": public, which: unusable}
    capsys.readouterr()
    assert verify_signed(bundle, given["signature"], given["public-key"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert str(unusable) in line
    assert line.count(str(unusable)) == 1  # said once, not wrapped in a second message


@pytest.mark.parametrize("path", ["missing.pem", "."])
def test_sign_with_an_unreadable_key_is_one_line_naming_it_once(
    signed: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str
) -> None:
    bundle, _, _ = signed
    key = tmp_path / path
    out = tmp_path / "other.sig"
    capsys.readouterr()
    assert main(["sign", str(bundle), "--key", str(key), "--out", str(out)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.count(str(key)) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "key", "reason"),
    [
        ("sign", "text", "not an unencrypted PEM private key"),
        ("sign", "public", "not an unencrypted PEM private key"),
        ("sign", "ec", "not an Ed25519 key (EC"),
        ("verify", "text", "not a PEM public key"),
        ("verify", "private", "not a PEM public key"),
        ("verify", "ec", "not an Ed25519 public key (EC"),
    ],
)
def test_a_key_that_is_not_the_ed25519_key_asked_for_is_one_line_naming_it(
    signed: tuple[Path, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    key: str,
    reason: str,
) -> None:
    bundle, signature, public = signed
    (tmp_path / "text.pem").write_text("not a key\n")
    ec_private, ec_public = write_key(tmp_path, "ec", ec.generate_private_key(ec.SECP256R1()))
    path = {
        "text": tmp_path / "text.pem",
        "public": public,
        "private": tmp_path / "runner.pem",
        "ec": ec_private if command == "sign" else ec_public,
    }[key]
    out = tmp_path / "other.sig"
    capsys.readouterr()
    if command == "sign":
        assert main(["sign", str(bundle), "--key", str(path), "--out", str(out)]) == 2
    else:
        assert verify_signed(bundle, signature, path) == 2
    stdout, err = capsys.readouterr()
    [line] = err.splitlines()
    assert f"{path}: {reason}" in line
    assert stdout == "" and not out.exists()
