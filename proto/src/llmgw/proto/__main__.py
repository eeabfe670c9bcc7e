"""`python -m llmgw.proto` prints the JSON Schema of every message (the golden file)."""

import sys

from llmgw.proto._messages import schema_json

sys.stdout.buffer.write(schema_json())
