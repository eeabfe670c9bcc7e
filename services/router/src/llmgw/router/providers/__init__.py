"""Outside OpenAI-compatible providers answering some of the fleet's models (`store.Providers`)."""
