"""Keys as JWK (RFC 7517), named by their RFC 7638 thumbprint, bound to one RFC 9421 algorithm.

A key knows its algorithm so that a signature without ``alg`` (the USP document's own example
has none) still verifies under exactly one algorithm: the one the key's JWK names. The
cryptographic primitives are ``http_message_signatures``' algorithm classes over ``cryptography``
keys; this module only maps JWK members to them and back.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast, runtime_checkable

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from http_message_signatures import HTTPMessageSignaturesException, algorithms

__all__ = [
    "DEFAULT_ALGORITHMS",
    "Algorithm",
    "KeyResolver",
    "PublicKey",
    "SigningKey",
    "b64url_decode",
    "b64url_encode",
    "jwk_thumbprint",
]

Algorithm = Literal["ed25519", "ecdsa-p256-sha256", "rsa-pss-sha512", "rsa-v1_5-sha256", "hmac-sha256"]

#: The algorithms of the USP signature profile; the others verify only when a policy opts in.
DEFAULT_ALGORITHMS: frozenset[str] = frozenset({"ed25519", "ecdsa-p256-sha256"})

_ALGORITHM_CLASSES: dict[str, type[algorithms.HTTPSignatureAlgorithm]] = {
    "ed25519": algorithms.ED25519,
    "ecdsa-p256-sha256": algorithms.ECDSA_P256_SHA256,
    "rsa-pss-sha512": algorithms.RSA_PSS_SHA512,
    "rsa-v1_5-sha256": algorithms.RSA_V1_5_SHA256,
    "hmac-sha256": algorithms.HMAC_SHA256,
}
# JOSE "alg" names (RFC 7518, RFC 8037) for the same algorithms, used in JWKs and JWS headers.
JOSE_TO_HTTPSIG = {
    "EdDSA": "ed25519",
    "Ed25519": "ed25519",
    "ES256": "ecdsa-p256-sha256",
    "PS512": "rsa-pss-sha512",
    "RS256": "rsa-v1_5-sha256",
    "HS256": "hmac-sha256",
}
_HTTPSIG_TO_JOSE = {
    "ed25519": "EdDSA",
    "ecdsa-p256-sha256": "ES256",
    "rsa-pss-sha512": "PS512",
    "rsa-v1_5-sha256": "RS256",
    "hmac-sha256": "HS256",
}
_CurveKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey | rsa.RSAPublicKey | bytes


def b64url_encode(data: bytes) -> str:
    """Unpadded base64url, as JOSE writes binary members."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode unpadded (or padded) base64url; raises ``ValueError`` on anything else."""
    if not isinstance(text, str) or any(c in text for c in "+/ \n\r\t"):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def jwk_thumbprint(jwk: Mapping[str, Any]) -> str:
    """RFC 7638 SHA-256 thumbprint of the public members of ``jwk``, base64url.

    >>> jwk_thumbprint({"kty": "OKP", "crv": "Ed25519",
    ...                 "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"})
    'poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U'
    """
    kty = jwk.get("kty")
    required = {
        "OKP": ("crv", "kty", "x"),
        "EC": ("crv", "kty", "x", "y"),
        "RSA": ("e", "kty", "n"),
        "oct": ("k", "kty"),
    }
    if kty not in required:
        raise ValueError(f"unsupported JWK kty {kty!r}")
    members = {name: jwk[name] for name in required[kty]}
    canonical = json.dumps(members, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return b64url_encode(hashlib.sha256(canonical.encode()).digest())


@dataclass(frozen=True)
class PublicKey:
    """A trusted verification key: its ``kid``, the one algorithm it verifies, the key itself.

    >>> key = PublicKey.from_jwk({"kty": "OKP", "crv": "Ed25519",
    ...                           "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"})
    >>> key.alg, key.kid
    ('ed25519', 'poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U')
    """

    kid: str
    alg: str
    key: _CurveKey = field(repr=False)
    jwk: Mapping[str, Any] = field(repr=False, compare=False)
    _verifier: algorithms.HTTPSignatureAlgorithm = field(repr=False, compare=False, hash=False)

    @classmethod
    def from_jwk(cls, jwk: Mapping[str, Any], *, alg: str | None = None) -> PublicKey:
        """Load a public JWK. ``kid`` is the JWK's own, else its RFC 7638 thumbprint.

        The algorithm comes from ``alg``, else the JWK's ``alg``, else its curve (OKP and EC keys
        name exactly one algorithm). RSA keys without either are refused: guessing between PSS
        and PKCS#1 v1.5 would let a signature choose its own algorithm.
        """
        try:
            key, public_jwk = _load_public(jwk)
            algorithm = _algorithm_for(jwk, alg)
            kid = str(jwk.get("kid") or jwk_thumbprint(public_jwk))
            public_jwk["kid"] = kid  # published JWKS name every key, as most JOSE clients expect
            public_jwk["alg"] = _HTTPSIG_TO_JOSE[algorithm]
            verifier = _ALGORITHM_CLASSES[algorithm](public_key=key)
        except (KeyError, ValueError, TypeError, HTTPMessageSignaturesException) as exc:
            raise ValueError(f"unusable JWK: {exc}") from exc
        return cls(kid=kid, alg=algorithm, key=key, jwk=public_jwk, _verifier=verifier)

    @property
    def jose_alg(self) -> str:
        """The JOSE name of this key's algorithm (``EdDSA``, ``ES256`` ...), for in-band JWS."""
        return _HTTPSIG_TO_JOSE[self.alg]

    def verify(self, signature: bytes, data: bytes) -> bool:
        """True when ``signature`` (raw; r‖s for ECDSA) is valid over ``data``. Never raises."""
        try:
            if self.alg == "ed25519":
                cast(ed25519.Ed25519PublicKey, self.key).verify(signature, data)
            else:
                self._verifier.verify(signature=signature, message=data)
        except (_CryptoInvalidSignature, HTTPMessageSignaturesException, ValueError, TypeError):
            return False
        return True


@runtime_checkable
class KeyResolver(Protocol):
    """Where a verifier finds the key named by a signature's ``keyid``.

    ``None`` means "not trusted". A remote resolver may fetch on a miss; ``aresolve`` is the same
    lookup for async callers, so an event loop never blocks on the network.
    """

    def resolve(self, kid: str) -> PublicKey | None: ...
    async def aresolve(self, kid: str) -> PublicKey | None: ...


@dataclass(frozen=True)
class SigningKey:
    """A private key the sender signs with. Its JWK never leaves the key store on purpose:
    ``repr`` hides it and only :attr:`public` is meant to be published.

    >>> key = SigningKey.generate()
    >>> key.public.verify(key.sign(b"hello"), b"hello")
    True
    """

    kid: str
    alg: str
    key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | bytes = field(
        repr=False
    )
    public: PublicKey = field(repr=False)
    _signer: algorithms.HTTPSignatureAlgorithm = field(repr=False, compare=False, hash=False)

    @classmethod
    def generate(cls, alg: str = "ed25519") -> SigningKey:
        """A fresh key for ``ed25519`` (default) or ``ecdsa-p256-sha256``, kid = thumbprint."""
        private: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
        if alg == "ed25519":
            private = ed25519.Ed25519PrivateKey.generate()
        elif alg == "ecdsa-p256-sha256":
            private = ec.generate_private_key(ec.SECP256R1())
        else:
            raise ValueError(f"cannot generate keys for {alg!r}")
        return cls.from_jwk(_private_jwk(private))

    @classmethod
    def from_jwk(cls, jwk: Mapping[str, Any], *, alg: str | None = None) -> SigningKey:
        """Load a private JWK (``d`` for OKP/EC/RSA, ``k`` for oct)."""
        try:
            private = _load_private(jwk)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"unusable private JWK: {exc}") from exc
        public = PublicKey.from_jwk(jwk, alg=alg)
        signer = _ALGORITHM_CLASSES[public.alg](private_key=private)
        return cls(kid=public.kid, alg=public.alg, key=private, public=public, _signer=signer)

    def sign(self, data: bytes) -> bytes:
        """Raw signature over ``data`` (r‖s for ECDSA, as RFC 9421 wants)."""
        if self.alg == "ed25519":
            return cast(ed25519.Ed25519PrivateKey, self.key).sign(data)
        return cast(bytes, self._signer.sign(data))

    def to_jwk(self) -> dict[str, Any]:
        """The private JWK, for the key store only. Never log or publish it."""
        jwk = _private_jwk(self.key)
        jwk["kid"] = self.kid
        jwk["alg"] = self.public.jose_alg
        return jwk


def _algorithm_for(jwk: Mapping[str, Any], alg: str | None) -> str:
    if alg is not None:
        if alg not in _ALGORITHM_CLASSES:
            raise ValueError(f"unsupported algorithm {alg!r}")
        return alg
    if "alg" in jwk:
        named = JOSE_TO_HTTPSIG.get(str(jwk["alg"]), str(jwk["alg"]))
        if named not in _ALGORITHM_CLASSES:
            raise ValueError(f"unsupported JWK alg {jwk['alg']!r}")
        return named
    kty, crv = jwk.get("kty"), jwk.get("crv")
    if kty == "OKP" and crv == "Ed25519":
        return "ed25519"
    if kty == "EC" and crv == "P-256":
        return "ecdsa-p256-sha256"
    if kty == "oct":
        return "hmac-sha256"
    raise ValueError(f"JWK of kty {kty!r} must name its alg")


def _int(value: Any) -> int:
    return int.from_bytes(b64url_decode(str(value)), "big")


def _load_public(jwk: Mapping[str, Any]) -> tuple[_CurveKey, dict[str, Any]]:
    kty = jwk["kty"]
    if kty == "OKP":
        if jwk["crv"] != "Ed25519":
            raise ValueError(f"unsupported OKP curve {jwk['crv']!r}")
        raw = b64url_decode(jwk["x"])
        return ed25519.Ed25519PublicKey.from_public_bytes(raw), {
            "kty": "OKP",
            "crv": "Ed25519",
            "x": jwk["x"],
        }
    if kty == "EC":
        if jwk["crv"] != "P-256":
            raise ValueError(f"unsupported EC curve {jwk['crv']!r}")
        x, y = b64url_decode(jwk["x"]), b64url_decode(jwk["y"])
        if len(x) != 32 or len(y) != 32:
            raise ValueError("P-256 coordinates must be 32 bytes")
        key = ec.EllipticCurvePublicNumbers(_int(jwk["x"]), _int(jwk["y"]), ec.SECP256R1()).public_key()
        return key, {"kty": "EC", "crv": "P-256", "x": jwk["x"], "y": jwk["y"]}
    if kty == "RSA":
        key_rsa = rsa.RSAPublicNumbers(_int(jwk["e"]), _int(jwk["n"])).public_key()
        return key_rsa, {"kty": "RSA", "e": jwk["e"], "n": jwk["n"]}
    if kty == "oct":
        return b64url_decode(jwk["k"]), {"kty": "oct", "k": jwk["k"]}
    raise ValueError(f"unsupported kty {kty!r}")


def _load_private(
    jwk: Mapping[str, Any],
) -> ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | bytes:
    kty = jwk["kty"]
    if kty == "OKP":
        return ed25519.Ed25519PrivateKey.from_private_bytes(b64url_decode(jwk["d"]))
    if kty == "EC":
        return ec.derive_private_key(_int(jwk["d"]), ec.SECP256R1())
    if kty == "RSA":
        public = rsa.RSAPublicNumbers(_int(jwk["e"]), _int(jwk["n"]))
        return rsa.RSAPrivateNumbers(
            p=_int(jwk["p"]),
            q=_int(jwk["q"]),
            d=_int(jwk["d"]),
            dmp1=_int(jwk["dp"]),
            dmq1=_int(jwk["dq"]),
            iqmp=_int(jwk["qi"]),
            public_numbers=public,
        ).private_key()
    if kty == "oct":
        return b64url_decode(jwk["k"])
    raise ValueError(f"unsupported kty {kty!r}")


def _private_jwk(key: object) -> dict[str, Any]:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        from cryptography.hazmat.primitives import serialization as ser

        d = key.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())
        x = key.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
        return {"kty": "OKP", "crv": "Ed25519", "x": b64url_encode(x), "d": b64url_encode(d)}
    if isinstance(key, ec.EllipticCurvePrivateKey):
        numbers = key.private_numbers()
        pub = numbers.public_numbers
        return {
            "kty": "EC",
            "crv": "P-256",
            "x": b64url_encode(pub.x.to_bytes(32, "big")),
            "y": b64url_encode(pub.y.to_bytes(32, "big")),
            "d": b64url_encode(numbers.private_value.to_bytes(32, "big")),
        }
    if isinstance(key, bytes):
        return {"kty": "oct", "k": b64url_encode(key)}
    raise ValueError("only Ed25519, P-256 and HMAC keys are exported")
