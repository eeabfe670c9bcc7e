"""The node's firewall, kept by its agent: engines' ports and llama.cpp's RPC workers (which
have no authentication of their own) take connections only from the fleet's machines (its
routers and nodes, as the `fleet` bucket says where they are) and the loopback; the agent's
admin port only from those and from where the operator says (`admin_from`). One nftables table,
`inet llmgw`, written whole each time the fleet changes; nothing else on the machine is touched.

`firewall_rules` decides them; `Firewall` applies them (`nft -f -`), or, where this agent may
not change the firewall, says so once and writes the rules it would keep to
<data>/agent/firewall.nft.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

__all__ = ["Firewall"]


class Firewall:
    """Applies the rules when they change; where it may not, says so once and writes them down."""

    def __init__(self, folder: Path, log) -> None:
        self.path = folder / "firewall.nft"
        self.log = log
        self.applied = ""
        self.refused = False

    async def keep(self, rules: str) -> bool:
        """Apply `rules` if they differ from the ones applied; whether they hold now."""
        if rules == self.applied:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(rules)
        nft = shutil.which("nft")
        why = "nftables' `nft` is not installed" if nft is None else ""
        if nft is not None:
            proc = await asyncio.create_subprocess_exec(
                nft, "-f", "-", stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            _, err = await proc.communicate(rules.encode())
            why = "" if proc.returncode == 0 else err.decode(errors="replace").strip()[:300]
        if why:
            if not self.refused:
                self.log.warning(
                    "this agent may not change the firewall: engines' ports are open to whoever reaches them",
                    why=why,
                    rules=str(self.path),
                )
            self.refused = True
            return False
        self.applied, self.refused = rules, False
        self.log.info("firewall kept: engines' ports open to the fleet only", rules=str(self.path))
        return True
