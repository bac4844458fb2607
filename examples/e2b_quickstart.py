"""E2B's code interpreter SDK, unchanged, against sandpod (docs/e2b.md).

set -a && . .cluster/e2b.env && set +a && .venv/bin/python examples/e2b_quickstart.py
"""

from e2b_code_interpreter import Sandbox

with Sandbox.create(metadata={"example": "quickstart"}) as sandbox:
    sandbox.run_code("x = 41")
    execution = sandbox.run_code("print('hello from', __import__('sys').version.split()[0])\nx + 1")
    print(execution.logs.stdout[0], end="")
    print("x + 1 =", execution.text)
    error = sandbox.run_code("1 / 0").error
    print("error:", error.name if error else None, "-", error.value if error else None)
    sandbox.files.write("/home/user/notes.txt", "written through envd's files API\n")
    print(sandbox.commands.run("cat notes.txt && ls").stdout, end="")
    print("sandbox", sandbox.sandbox_id, "is CodeSession", sandbox.sandbox_id, "(kubectl get cxs)")
