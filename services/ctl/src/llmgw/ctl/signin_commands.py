"""`llmgw ctl signin ...`: how people sign in besides local users, a directory (LDAP, Active
Directory) and an OpenID Connect provider, set as the console's sign-in settings page sets them
(the router's `signin.*` endpoints: tried before they are kept, secrets read from stdin, sealed,
never shown back)."""

from __future__ import annotations

import argparse
import sys

import msgspec
from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.changes import BY
from llmgw.ctl.tree import Noun, Verb, done, show
from llmgw.proto import Empty, people
from llmgw.proto.people import GroupRole, LdapSettings, OidcSettings, SignInSettings, SignInTry

__all__ = ["SIGNIN", "signin_text"]


def _groups(given: list[str]) -> list[GroupRole]:
    """`--group GROUP=TENANT:ROLE` each; SystemExit saying the form where one is not it."""
    try:
        return [GroupRole.parse(item) for item in given]
    except ValueError as exc:
        raise SystemExit(f"error: --group {exc}") from None


def signin_text(s: SignInSettings) -> str:
    """The settings as `signin show` prints them: each field, each secret only as kept or not."""
    lines = []
    for part, name in ((s.ldap, "ldap"), (s.oidc, "oidc")):
        if part is None:
            lines.append(f"{name}: not set up")
            continue
        lines.append(f"{name}:")
        for field, value in msgspec.structs.asdict(part).items():
            if field in ("bind_password", "client_secret"):
                value = "kept" if f"{name}.{field}" in s.secrets_kept else "none"
            elif field == "groups":
                value = ", ".join(f"{g.group} = {g.role} of {g.tenant}" for g in part.groups) or "none mapped"
            lines.append(f"  {field}: {value}")
    return "\n".join(lines)


async def _show(nc: Client, args: argparse.Namespace) -> int:
    shown = await call(nc, people.SIGNIN_SHOW, Empty())
    return show(args, shown, signin_text(shown))


async def _keep(nc: Client, args: argparse.Namespace, **part: object) -> int:
    """Keep the kept settings with one part replaced (its secret, left empty, kept as it was)."""
    kept = await call(nc, people.SIGNIN_SHOW, Empty())
    given = msgspec.structs.replace(kept, secrets_kept=[], by=BY, **part)
    said = await call(nc, people.SIGNIN_PUT, given, timeout=40.0)
    return done(args, said, "kept: " + "; ".join(said.said))


def _secret(args: argparse.Namespace) -> str:
    return sys.stdin.readline().rstrip("\n") if args.secret_stdin else ""


async def _ldap(nc: Client, args: argparse.Namespace) -> int:
    fields = {
        "url": args.url,
        "starttls": args.starttls,
        "ca_file": args.ca_file,
        "bind_dn": args.bind_dn,
        "bind_password": _secret(args),
        "user_base": args.user_base,
        "user_filter": args.user_filter,
        "group_base": args.group_base,
        "group_filter": args.group_filter,
        "groups": _groups(args.group),
    }
    return await _keep(nc, args, ldap=msgspec.convert(fields, LdapSettings))


def _ldap_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="ldap://host:389 (with --starttls) or ldaps://host:636")
    parser.add_argument("--starttls", action="store_true", help="StartTLS before binding")
    parser.add_argument("--ca-file", default="", help="the CA that signed the directory's certificate")
    parser.add_argument("--bind-dn", default="", help="who searches (default: anonymously)")
    parser.add_argument("--user-base", required=True, help="where users are searched")
    parser.add_argument("--user-filter", default="(uid={name})", help="{name}: the name signed in with, escaped")
    parser.add_argument("--group-base", default="", help="where groups are searched (default: the user base)")
    parser.add_argument("--group-filter", default="(member={dn})", help="{dn}: the user's DN, escaped")
    _shared(parser, "the bind DN's password")


def _shared(parser: argparse.ArgumentParser, secret: str) -> None:
    parser.add_argument(
        "--secret-stdin", action="store_true", help=f"read {secret} from stdin (empty: keep the kept one)"
    )
    parser.add_argument(
        "--group", action="append", default=[], metavar="GROUP=TENANT:ROLE", help="map a group to a role (repeat it)"
    )


async def _oidc(nc: Client, args: argparse.Namespace) -> int:
    fields = {
        "issuer": args.issuer,
        "client_id": args.client_id,
        "client_secret": _secret(args),
        "label": args.label,
        "name_claim": args.name_claim,
        "groups_claim": args.groups_claim,
        "groups": _groups(args.group),
    }
    return await _keep(nc, args, oidc=msgspec.convert(fields, OidcSettings))


def _oidc_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("issuer", metavar="ISSUER", help="the provider's issuer URL (its discovery document's)")
    parser.add_argument("--client-id", required=True, help="this console's client id at the provider")
    parser.add_argument("--label", default="", help='what the button says after "Sign in with"')
    parser.add_argument("--name-claim", default="preferred_username", help="the claim a user is named by")
    parser.add_argument("--groups-claim", default="groups", help="the claim listing the user's groups")
    _shared(parser, "the client secret")


async def _off(nc: Client, args: argparse.Namespace) -> int:
    return await _keep(nc, args, **{args.part: None})


def _off_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("part", choices=["ldap", "oidc"], help="which to stop signing in with")


async def _try(nc: Client, args: argparse.Namespace) -> int:
    kept = await call(nc, people.SIGNIN_SHOW, Empty())
    ask = SignInTry(settings=msgspec.structs.replace(kept, secrets_kept=[]), name=args.name, by=BY)
    said = await call(nc, people.SIGNIN_TRY, ask, timeout=40.0)
    return show(args, said, "\n".join(said.said))


def _try_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="", help="a directory user to look up (its DN, groups and roles)")


_SHOW = Verb("show", "the sign-in settings (secrets only said to be kept)", "llmgw ctl signin show", "", _show)
SIGNIN = Noun(
    "signin",
    "how people sign in besides local users: a directory, an OpenID Connect provider",
    (
        _SHOW,
        Verb(
            "ldap",
            "sign in with an LDAP directory or Active Directory (tried first, then kept)",
            "llmgw ctl signin ldap ldap://dc:389 --starttls --bind-dn CN=llmgw,... --secret-stdin --user-base OU=...",
            "a name no local user has signs in against it; its groups map to roles",
            _ldap,
            _ldap_arguments,
        ),
        Verb(
            "oidc",
            "sign in with an OpenID Connect provider (its discovery read first, then kept)",
            "llmgw ctl signin oidc https://sso.example.com --client-id llmgw --secret-stdin --group ml=research:member",
            "the console's sign-in page offers it; register <console>/console/signin/provider/back with it",
            _oidc,
            _oidc_arguments,
        ),
        Verb("try", "try the kept settings again", "llmgw ctl signin try --name ada", "", _try, _try_arguments),
        Verb(
            "off",
            "stop signing in with the directory or the provider",
            "llmgw ctl signin off ldap",
            "",
            _off,
            _off_arguments,
        ),
    ),
    default=_SHOW,
)
"""`llmgw ctl signin show|ldap|oidc|try|off`."""
