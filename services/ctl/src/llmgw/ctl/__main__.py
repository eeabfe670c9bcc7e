"""`python -m llmgw.ctl` is the `llmgw` command."""

import sys

from llmgw.ctl.cli import main

sys.exit(main())
