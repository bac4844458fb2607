"""The sandpod contract: what the operator, the gateway, the bench and the tests share.

The CodeExecution resource (models, names, quantities), the language catalog, and the
runner protocol (frames and result). Free of kopf and FastAPI.
"""
