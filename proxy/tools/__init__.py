"""Built-in tools served to the model: fetch, history search, streamed execution."""
