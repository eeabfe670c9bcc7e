"""The router's HTTP: its own front door for the OpenAI routes (connections, seats, tunnels to
the ASGI app), the OpenAI endpoint, the Litestar app, and the connections to engines."""
