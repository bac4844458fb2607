"""sandpod gateway: the HTTP (and MCP) front door for agents."""
