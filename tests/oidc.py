"""A real OpenID Connect provider for the tests: `oidc-provider-mock` (a Flask provider built on
authlib, from PyPI; it signs ID tokens with its own RSA key and publishes it), run as its own
process on a free port with the users the test names, stopped after. Any client id and secret
are taken, as its docs say; a code is good once."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx

from llmgw.bus import free_port

__all__ = ["Provider", "code_for"]


class Provider:
    """The provider at `url`, its users given as claims (each with a `sub`)."""

    def __init__(self, users: list[dict], token_max_age: int = 3600) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-W", "ignore", "-m", "oidc_provider_mock", "--port", str(self.port)]
        args += ["--require-nonce", "true", "--token-max-age", str(token_max_age)]
        for claims in users:
            args += ["--user-claims", json.dumps(claims)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/.well-known/openid-configuration", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"the OpenID provider did not start: {self.proc.stdout.read().decode()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def code_for(authorize_url: str, sub: str) -> str:
    """What the provider's form does when `sub` signs in: the URL it sends the browser back to
    (with the code and state)."""
    answer = httpx.post(authorize_url, data={"sub": sub}, follow_redirects=False, timeout=10)
    assert answer.status_code in (302, 303), answer.text[:500]
    return answer.headers["location"]
