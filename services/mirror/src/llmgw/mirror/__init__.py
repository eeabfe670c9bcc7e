"""The mirror: the weights files, listed, hashed and served over HTTP to agents."""
