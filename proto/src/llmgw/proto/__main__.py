"""`python -m llmgw.proto` prints the JSON Schema of every message (the golden file);
`python -m llmgw.proto subjects` prints docs/subjects.md."""

import sys

from llmgw.proto._schema import schema_json, subjects_markdown

if sys.argv[1:] == ["subjects"]:
    sys.stdout.write(subjects_markdown())
else:
    sys.stdout.buffer.write(schema_json())
