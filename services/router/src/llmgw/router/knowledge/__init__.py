"""Knowledge bases: documents read and cut (`parse.py`, `chunk.py`), embedded by the router
(`ingest.py`), kept in JetStream and indexed in memory (`store.py`, `index.py`), and put in a
chat's prompt with the sources it used (`augment.py`)."""
