"""A real OpenLDAP server (Debian's `slapd`) for the tests: started on a free port in a temporary
folder with a small directory the test writes (users, groups), stopped after."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from llmgw.bus import TlsFiles, free_port

__all__ = ["BASE", "Slapd", "group", "user"]

BASE = "dc=example,dc=com"
_CONF = """include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {home}/slapd.pid
database mdb
maxsize 10485760
suffix "{base}"
rootdn "cn=admin,{base}"
rootpw admin-password
directory {home}/data
"""
_TOP = f"""dn: {BASE}
objectClass: dcObject
objectClass: organization
o: Example
dc: example

dn: ou=people,{BASE}
objectClass: organizationalUnit
ou: people

dn: ou=groups,{BASE}
objectClass: organizationalUnit
ou: groups
"""


def user(uid: str, password: str, extra: str = "") -> str:
    """An inetOrgPerson under ou=people (`extra`: more attribute lines)."""
    return f"dn: uid={uid},ou=people,{BASE}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {uid}\nsn: {uid}\n" + (
        f"userPassword: {password}\n{extra}"
    )


def group(cn: str, *members: str) -> str:
    """A groupOfNames under ou=groups with these users (by uid) as members."""
    lines = "".join(f"member: uid={m},ou=people,{BASE}\n" for m in members)
    return f"dn: cn={cn},ou=groups,{BASE}\nobjectClass: groupOfNames\ncn: {cn}\n{lines}"


class Slapd:
    """slapd serving `entries` (LDIF records) on 127.0.0.1 at a free port."""

    def __init__(self, home: Path, entries: list[str], tls: TlsFiles | None = None) -> None:
        """`tls`: its certificate and key, so that clients can StartTLS (ldaps is not served)."""
        assert shutil.which("slapd") or Path("/usr/sbin/slapd").exists(), (
            "Debian's slapd is missing: ./dev installs it (apt-get install slapd ldap-utils)"
        )
        self.home, self.port = home, free_port()
        self.url = f"ldap://127.0.0.1:{self.port}"
        (home / "data").mkdir(parents=True, exist_ok=True)
        conf = home / "slapd.conf"
        tls_lines = (
            f"TLSCertificateFile {tls.cert}\nTLSCertificateKeyFile {tls.key}\nTLSCACertificateFile {tls.ca}\n"
            if tls
            else ""
        )
        conf.write_text(tls_lines + _CONF.format(home=home, base=BASE))
        (home / "data.ldif").write_text("\n".join([_TOP, *entries]))
        slapadd = shutil.which("slapadd") or "/usr/sbin/slapadd"
        subprocess.run([slapadd, "-f", str(conf), "-l", str(home / "data.ldif")], check=True, capture_output=True)
        slapd = shutil.which("slapd") or "/usr/sbin/slapd"
        self.log = open(home / "slapd.log", "wb")
        self.proc = subprocess.Popen(
            [slapd, "-f", str(conf), "-h", f"{self.url}/", "-d", "0"], stdout=self.log, stderr=self.log
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"slapd did not listen: {(home / 'slapd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
