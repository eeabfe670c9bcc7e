"""The MCP SDK is the router's heaviest import (about 0.6 s): it loads with the first MCP
request or server linked, never with the router's start."""

import subprocess
import sys


def test_starting_the_router_imports_no_mcp_sdk():
    code = (
        "import sys\n"
        "import llmgw.router.service\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout
