"""What several suites expect of the product as it ships: the tools an agent is offered (in
this order) and the default catalog's languages (sorted)."""

AGENT_TOOLS = ["run_code", "open_session", "run_in_session", "run_command", "close_session"]
CATALOG_LANGUAGES = ["bash", "csharp", "go", "javascript", "python", "typescript"]
