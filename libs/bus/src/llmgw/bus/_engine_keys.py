"""Engine keys, derived where they are needed and never sent.

Every engine demands an API key, so that knowing a node's address is not enough to use its
engines past the router's keys, limits and usage. The key of a replica is worked out, not handed
around: `HMAC(node secret, replica id)`, where a node's secret is `HMAC(fleet secret, node)`. The
router holds the fleet secret (it talks to every engine); each agent holds only its node's secret
(it starts only its own engines, and cannot work out another node's keys). Nothing carries a key:
no bucket, no request, no event, no log line.

A secret file is one line: `llmgw-engine-fleet <hex>` (the router's) or
`llmgw-engine-node <node> <hex>` (an agent's). `llmgw up` and `llmgw access write` make them.
Without a file, keys are derived from an empty secret: anyone who can read a replica's id (it is
in `llmgw ctl replica list`) can work out its key, which is fine on one machine with the engines
on the loopback and nowhere else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from pathlib import Path

from llmgw.bus._access import CredentialsError
from llmgw.bus._proc import write_private

__all__ = ["EngineKeys", "EngineSecretError", "new_fleet_secret", "node_secret", "write_secret"]

_FLEET, _NODE = "llmgw-engine-fleet", "llmgw-engine-node"


class EngineSecretError(CredentialsError):
    """An engine secret file that cannot be used; the message says which and what to do (a
    service meeting one at start exits 2, as with wrong credentials)."""


def _mac(secret: bytes, what: str) -> bytes:
    return hmac.new(secret, what.encode(), hashlib.sha256).digest()


def new_fleet_secret() -> str:
    """A fresh fleet secret, as its file's line."""
    return f"{_FLEET} {secrets.token_hex(32)}"


def node_secret(fleet_line: str, node: str) -> str:
    """The secret of `node` (its agent's file's line), worked out from the fleet's."""
    keys = EngineKeys.parse(fleet_line, where="the fleet secret")
    if keys.node:
        raise EngineSecretError("a node's secret is worked out from the fleet's, not from another node's")
    return f"{_NODE} {node} {keys._node_secret(node).hex()}"


def write_secret(path: Path, line: str) -> None:
    """Write a secret file readable by its owner alone (0600)."""
    write_private(path, line + "\n")


class EngineKeys:
    """Works out engines' keys: every node's from the fleet secret, or one node's from its own."""

    def __init__(self, secret: bytes, node: str = "") -> None:
        self._secret = secret
        self.node = node
        """The one node these keys are for; empty: the fleet's (every node)."""

    @property
    def insecure(self) -> bool:
        """Whether these are the keys of no secret (anyone can work them out)."""
        return not self._secret

    @classmethod
    def parse(cls, line: str, where: str) -> EngineKeys:
        """The keys of a secret file's line; `where` names the file in errors."""
        parts = line.split()
        try:
            if len(parts) == 2 and parts[0] == _FLEET:
                return cls(bytes.fromhex(parts[1]))
            if len(parts) == 3 and parts[0] == _NODE:
                return cls(bytes.fromhex(parts[2]), node=parts[1])
        except ValueError:
            pass
        raise EngineSecretError(
            f"{where}: not an engine secret (a line `{_FLEET} <hex>` or `{_NODE} <node> <hex>`); "
            "`llmgw up` and `llmgw access write` make them"
        )

    @classmethod
    def read(cls, path: str, node: str = "") -> EngineKeys:
        """The keys in secret file `path` (empty: the keys of no secret). With `node` (an agent's),
        the file must be that node's secret, or the fleet's."""
        if not path:
            return cls(b"")
        try:
            keys = cls.parse(Path(path).read_text(), where=f"engine secret {path}")
        except OSError as exc:
            raise EngineSecretError(f"engine secret {path}: {exc.strerror}") from None
        if node and keys.node and keys.node != node:
            raise EngineSecretError(
                f"engine secret {path} is node {keys.node}'s, and this is node {node}: give each agent its own"
            )
        if not node and keys.node:
            raise EngineSecretError(f"engine secret {path} is node {keys.node}'s: the router needs the fleet's")
        return keys

    def _node_secret(self, node: str) -> bytes:
        if self.node:
            if node != self.node:
                raise EngineSecretError(f"these are node {self.node}'s keys, not node {node}'s")
            return self._secret
        return _mac(self._secret, f"node:{node}")

    def derive(self, purpose: str) -> bytes:
        """A secret for something else the fleet's routers share (the console's session cookies),
        worked out from the fleet secret; empty where there is none (then each router picks its own)."""
        return _mac(self._secret, f"purpose:{purpose}") if self._secret and not self.node else b""

    def key(self, node: str, replica: str) -> str:
        """The key the engine of `replica` on `node` demands."""
        digest = _mac(self._node_secret(node), f"replica:{replica}")
        return base64.urlsafe_b64encode(digest[:24]).decode()
