"""The router's HTTP for its clients: its own front door for the OpenAI routes (connections,
seats, tunnels to the ASGI app), the OpenAI endpoint, and the Litestar app."""
