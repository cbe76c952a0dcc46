"""``usp-receiver``: verify, sign and make keys for USP webhook requests from the shell.

For debugging an integration by hand: save a delivery as a raw HTTP request (request line,
headers, blank line, body) and ask whether it verifies, and why not; or sign a hand-written
request with a test key and feed it to your receiver::

    usp-receiver keygen --out key.jwk --jwks jwks.json
    usp-receiver sign --key key.jwk request.http | usp-receiver verify --jwks jwks.json -

Exit status: 0 valid (or done), 1 invalid signature, 2 usage error or unreadable input.

The commands need the ``cli`` extra (Typer and Rich); the module imports neither at import time,
so :func:`main` can say so instead of failing with a traceback.
"""

import enum
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

from usp_receiver._digest import check_content_digest
from usp_receiver._errors import KeyFetchError, ReceiverError, VerificationError
from usp_receiver._jwks import JWKS, RemoteJWKS
from usp_receiver._keys import KeyResolver, SigningKey
from usp_receiver._rawhttp import RawRequest, RawRequestError, parse_request
from usp_receiver._sign import sign_request
from usp_receiver._verify import USP_TAG, VerificationPolicy, Verified, Verifier

if TYPE_CHECKING:
    import typer

__all__ = ["KeyAlgorithm", "Profile", "build_app", "main"]

_T = TypeVar("_T")

NEEDS_EXTRA = "usp-receiver's CLI needs the cli extra: pip install 'usp-receiver[cli]'"
_REQUEST_HELP = "Raw HTTP request file; - for stdin."


class Profile(enum.StrEnum):
    """Which signatures ``verify`` accepts."""

    USP = "usp"
    ANY = "any"


class KeyAlgorithm(enum.StrEnum):
    """Algorithms ``keygen`` makes keys for (the USP profile's two)."""

    ED25519 = "ed25519"
    ECDSA_P256_SHA256 = "ecdsa-p256-sha256"


def main() -> None:
    """Console-script entry point (``usp-receiver``)."""
    try:
        import rich  # noqa: F401
        import typer  # noqa: F401
    except ImportError:
        print(NEEDS_EXTRA, file=sys.stderr)
        raise SystemExit(2) from None
    build_app()(prog_name="usp-receiver")


def build_app() -> "typer.Typer":
    """The Typer application; built on demand so importing this module needs no Typer.

    >>> from typer.testing import CliRunner  # doctest: +SKIP
    >>> CliRunner().invoke(build_app(), ["verify", "--jwks", "jwks.json", "req.http"])  # doctest: +SKIP
    """
    import typer

    app = typer.Typer(
        name="usp-receiver",
        help="Verify, sign and make keys for USP webhook requests (RFC 9421 + RFC 9530).",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode="markdown",  # reflows docstring paragraphs
        # A traceback with locals could print a private key; keep tracebacks plain.
        pretty_exceptions_show_locals=False,
    )

    @app.command(no_args_is_help=True)
    def verify(
        request_file: Annotated[str, typer.Argument(metavar="REQUEST_FILE", help=_REQUEST_HELP)],
        jwks: Annotated[str, typer.Option("--jwks", help="JWKS file, or its http(s) URL.")],
        at: Annotated[
            float | None, typer.Option("--at", help="Verify as of this Unix time (default: now).")
        ] = None,
        scheme: Annotated[str, typer.Option("--scheme", help="Scheme of the URL the sender used.")] = "https",
        tag: Annotated[
            str, typer.Option("--tag", help="Application tag a tagged signature must carry.")
        ] = USP_TAG,
        profile: Annotated[Profile, typer.Option("--profile", help="usp or any (see above).")] = Profile.USP,
        allow_insecure_http: Annotated[
            bool, typer.Option("--allow-insecure-http", help="Allow an http:// JWKS URL (local tests only).")
        ] = False,
    ) -> None:
        """Verify a raw HTTP request's signature and print the verdict.

        The URL is SCHEME://Host + request target. Profiles: 'usp' (default) is the receiver's
        policy: the signature covers @method, @authority, @path, content-digest and content-type,
        has a created time within 300 s (60 s ahead), and Content-Digest must match the body.
        'any' accepts any covered components and a signature without created (the window then
        applies only when created is present); a Content-Digest present must still match the
        body, a body without one is accepted, protected only by what the signature covers.
        Both refuse a tag other than --tag and algorithms other than ed25519/ecdsa-p256-sha256.

        Exit status: 0 valid, 1 invalid, 2 usage error or unreadable input.
        """
        request = _parse(_read_input(request_file))
        url = _or_usage(lambda: request.url(scheme))
        resolver = _resolver(jwks, allow_insecure_http)
        try:
            verified = _check(request, url, resolver, _policy(profile, tag), profile, at)
        except VerificationError as exc:
            _out(f"invalid: {exc.reason}")
            _out(exc.detail)
            raise typer.Exit(1) from None
        except KeyFetchError as exc:
            _fail(f"cannot fetch the keys: {exc.detail}")
        finally:
            if isinstance(resolver, RemoteJWKS):
                resolver.close()
        _report(verified)

    @app.command(no_args_is_help=True)
    def sign(
        request_file: Annotated[str, typer.Argument(metavar="REQUEST_FILE", help=_REQUEST_HELP)],
        key: Annotated[
            list[str],
            typer.Option("--key", help="Private JWK file; repeat for key rotation (new key first)."),
        ],
        created: Annotated[
            int | None, typer.Option("--created", help="Signature created time (default: now).")
        ] = None,
        scheme: Annotated[
            str, typer.Option("--scheme", help="Scheme of the URL the request is sent to.")
        ] = "https",
        tag: Annotated[str, typer.Option("--tag", help="Application tag to put on the signature.")] = USP_TAG,
    ) -> None:
        """Sign a raw HTTP request as a USP sender does and print it.

        Content-Digest, Signature-Input and Signature are added (or replaced); everything else is
        kept as is, line ends become CRLF. The request must have Host and Content-Type headers.
        """
        request = _parse(_read_input(request_file))
        keys = [_load_private_key(path) for path in key]
        url = _or_usage(lambda: request.url(scheme))
        fields = _or_usage(
            lambda: sign_request(
                request.method, url, request.headers, request.body, keys, created=created, tag=tag
            )
        )
        sys.stdout.flush()
        sys.stdout.buffer.write(request.with_headers(fields).serialize())
        sys.stdout.buffer.flush()

    @app.command(no_args_is_help=True)
    def keygen(
        out: Annotated[Path, typer.Option("--out", help="Where to write the private JWK (mode 0600).")],
        alg: Annotated[
            KeyAlgorithm, typer.Option("--alg", help="Signature algorithm.")
        ] = KeyAlgorithm.ED25519,
        jwks: Annotated[
            Path | None, typer.Option("--jwks", help="Write the public JWKS here instead of printing it.")
        ] = None,
        force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
    ) -> None:
        """Make a test signing key.

        The private JWK goes to --out (mode 0600, never printed); the public JWKS to stdout or
        --jwks. The key's kid is its RFC 7638 thumbprint.
        """
        if jwks is not None and jwks.exists() and not force:
            _fail(f"{jwks} exists; pass --force to overwrite it")
        signing_key = SigningKey.generate(alg.value)
        _write_private(out, json.dumps(signing_key.to_jwk(), indent=2) + "\n", force)
        _err(f"private key {signing_key.kid} written to {out}; keep it secret")
        public = json.dumps(JWKS([signing_key.public]).to_dict(), indent=2) + "\n"
        if jwks is None:
            sys.stdout.write(public)
            return
        jwks.write_text(public)
        _err(f"public JWKS written to {jwks}")

    return app


# -- verify ---------------------------------------------------------------------------------------


def _policy(profile: Profile, tag: str) -> VerificationPolicy:
    if profile is Profile.USP:
        return VerificationPolicy(tag=tag)
    # The digest is checked by _check when present; the policy's rule would demand one.
    return VerificationPolicy(required_components=(), require_created=False, tag=tag, require_digest=False)


def _check(
    request: RawRequest,
    url: str,
    resolver: KeyResolver,
    policy: VerificationPolicy,
    profile: Profile,
    at: float | None,
) -> Verified:
    verified = Verifier(resolver, policy).verify(request.method, url, request.headers, request.body, now=at)
    digest = request.header("content-digest")
    if profile is Profile.ANY and digest is not None:
        check_content_digest(digest, request.body)
    return verified


def _resolver(source: str, allow_insecure_http: bool) -> KeyResolver:
    if source.startswith("http://") and not allow_insecure_http:
        # The library's own message names its keyword; here the user typed an option.
        _fail(f"the JWKS URL {source} is plain http: add --allow-insecure-http to allow it (local tests)")
    if source.startswith(("http://", "https://")):
        return _or_usage(lambda: RemoteJWKS(source, allow_insecure_http=allow_insecure_http))
    try:
        return JWKS.from_file(source)
    except OSError as exc:
        _fail(f"cannot read the JWKS {source}: {exc.strerror or exc}")
    except ValueError as exc:
        _fail(f"{source} is not a JWKS: {exc}")


def _report(verified: Verified) -> None:
    created = verified.created
    when = (
        "-" if created is None else f"{created} ({datetime.fromtimestamp(created, UTC):%Y-%m-%dT%H:%M:%SZ})"
    )
    rows = [
        ("keyid", verified.kid),
        ("label", verified.label),
        ("alg", verified.key.alg),
        ("created", when),
        ("tag", verified.tag or "-"),
    ]
    if verified.expires is not None:
        rows.append(("expires", str(verified.expires)))
    rows.append(("covers", " ".join(verified.components) or "-"))
    _out("valid")
    for name, value in rows:
        _out(f"  {name:<8} {value}")


# -- shared ---------------------------------------------------------------------------------------


def _read_input(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror or exc}")


def _parse(data: bytes) -> RawRequest:
    try:
        return parse_request(data)
    except RawRequestError as exc:
        _fail(f"not a raw HTTP request: {exc}")


def _load_private_key(path: str) -> SigningKey:
    try:
        document: Any = json.loads(Path(path).read_bytes())
        if not isinstance(document, dict) or ("d" not in document and "k" not in document):
            raise ValueError("it holds no private key (no 'd' member)")
        return SigningKey.from_jwk(document)
    except OSError as exc:
        _fail(f"cannot read the key {path}: {exc.strerror or exc}")
    except ValueError as exc:  # JSONDecodeError and unusable JWKs
        _fail(f"{path} is not a private JWK: {exc}")


def _write_private(path: Path, text: str, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        _fail(f"{path} exists; pass --force to overwrite it")
    except OSError as exc:
        _fail(f"cannot write {path}: {exc.strerror or exc}")
    with os.fdopen(fd, "w") as handle:
        os.chmod(path, 0o600)  # an existing file keeps its mode through O_TRUNC
        handle.write(text)


def _or_usage(action: Callable[[], _T]) -> _T:
    """Run ``action``; a ``ValueError`` (bad request, key or URL) is a usage error, exit 2."""
    try:
        return action()
    except (ValueError, ReceiverError) as exc:
        _fail(str(exc))


def _out(text: str) -> None:
    from rich.console import Console

    Console(soft_wrap=True, highlight=False).print(text, markup=False)


def _err(text: str) -> None:
    from rich.console import Console

    Console(stderr=True, soft_wrap=True, highlight=False).print(text, markup=False)


def _fail(message: str) -> NoReturn:
    import typer

    _err(f"error: {message}")
    raise typer.Exit(2)
