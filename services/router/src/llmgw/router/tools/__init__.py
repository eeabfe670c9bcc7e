"""The company's MCP tools through the gateway (`store.Tools`, `face.mcp_app`)."""
