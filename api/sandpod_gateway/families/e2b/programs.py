"""The Python programs an E2B sandbox runs for envd's calls (filesystem, commands), as runs in
its session: each binds no name in the session (its code runs in a namespace of its own) and
answers with its trailing expression, a JSON string, read back from the runner's verified
result. E2B's home /home/user is the session's work directory /tmp/work."""

import ast
import json
from typing import Any

from sandpod_gateway.families.e2b.protocol import HOME, E2bError

WORK_DIR = "/tmp/work"

_FILESYSTEM = r"""
import os, json, shutil, stat as st, datetime
def real(p):
    if p == HOME or p.startswith(HOME + "/"):
        return WORK + p[len(HOME):]
    return os.path.normpath(p if p.startswith("/") else os.path.join(WORK, p))
def shown(p):
    return HOME + p[len(WORK):] if p == WORK or p.startswith(WORK + "/") else p
def entry(p):
    s = os.lstat(p)
    kind = ("FILE_TYPE_SYMLINK" if st.S_ISLNK(s.st_mode) else
            "FILE_TYPE_DIRECTORY" if st.S_ISDIR(s.st_mode) else "FILE_TYPE_FILE")
    when = datetime.datetime.fromtimestamp(s.st_mtime, datetime.timezone.utc)
    e = {"name": os.path.basename(p.rstrip("/")) or "/", "type": kind, "path": shown(p),
         "size": str(s.st_size), "mode": s.st_mode & 0o7777,
         "permissions": st.filemode(s.st_mode), "owner": str(s.st_uid),
         "group": str(s.st_gid), "modifiedTime": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    if kind == "FILE_TYPE_SYMLINK":
        e["symlinkTarget"] = os.readlink(p)
    return e
def listing(p, depth):
    found = []
    for name in sorted(os.listdir(p)):
        child = os.path.join(p, name)
        found.append(entry(child))
        if depth > 1 and os.path.isdir(child) and not os.path.islink(child):
            found.extend(listing(child, depth - 1))
    return found
def call(op, a):
    try:
        if op == "Stat":
            return {"entry": entry(real(a["path"]))}
        if op == "ListDir":
            p = real(a["path"])
            if not os.path.isdir(p):
                return {"error": ["invalid_argument", "path is not a directory: " + a["path"]]}
            return {"entries": listing(p, int(a.get("depth") or 1))}
        if op == "MakeDir":
            p = real(a["path"])
            if os.path.lexists(p):
                return {"error": ["already_exists", "directory already exists: " + a["path"]]}
            os.makedirs(p)
            return {"entry": entry(p)}
        if op == "Move":
            source, target = real(a["source"]), real(a["destination"])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(source, target)
            return {"entry": entry(target)}
        if op == "Remove":
            p = real(a["path"])
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.remove(p)
            return {}
    except FileNotFoundError as exc:
        return {"error": ["not_found", str(exc)]}
    except PermissionError as exc:
        return {"error": ["permission_denied", str(exc)]}
    except OSError as exc:
        return {"error": ["invalid_argument", str(exc)]}
    return {"error": ["unimplemented", op]}
answer = json.dumps(call(OP, ARGS))
"""

_COMMAND = r"""
import os, sys, json, subprocess
r = subprocess.run(ARGS["argv"], cwd=ARGS["cwd"],
                   env={**os.environ, **ARGS["envs"]}, stdin=subprocess.DEVNULL,
                   capture_output=True)
sys.stdout.write(r.stdout.decode("utf-8", "replace"))
sys.stderr.write(r.stderr.decode("utf-8", "replace"))
answer = json.dumps({"exitCode": r.returncode})
"""

FILESYSTEM_CALLS = frozenset({"Stat", "ListDir", "MakeDir", "Move", "Remove"})


def _program(source: str, op: str, args: dict[str, Any]) -> str:
    namespace = {"OP": op, "ARGS": args, "HOME": HOME, "WORK": WORK_DIR}
    return f"(lambda g: (exec({source!r}, g), g['answer'])[1])({namespace!r})"


def filesystem_program(op: str, args: dict[str, Any]) -> str:
    return _program(_FILESYSTEM, op, args)


def work_path(path: str) -> str:
    """An E2B path as a path in the sandbox (the home is the work directory)."""
    if path == HOME or path.startswith(HOME + "/"):
        return WORK_DIR + path[len(HOME) :]
    return path if path.startswith("/") else f"{WORK_DIR}/{path}"


def command_program(argv: list[str], cwd: str | None, envs: dict[str, str]) -> str:
    return _program(_COMMAND, "Start", {"argv": argv, "cwd": work_path(cwd or HOME), "envs": envs})


def relative_path(path: str) -> str:
    """An E2B file path as a path relative to the work directory (what sandpod's session
    files take); 400 for one outside it."""
    if path.startswith(HOME + "/"):
        return path[len(HOME) + 1 :]
    if path.startswith(WORK_DIR + "/"):
        return path[len(WORK_DIR) + 1 :]
    if not path.startswith("/"):
        return path
    raise E2bError(400, f"path {path!r}: files move in and out under {HOME} (the work directory)")


def answer_of(result: str | None) -> dict[str, Any]:
    """The program's JSON answer, from the repr of its trailing expression."""
    try:
        text = ast.literal_eval(result) if result is not None else None
        answer = json.loads(text) if isinstance(text, str) else None
    except (ValueError, SyntaxError, RecursionError):
        # RecursionError: a run in the session may answer with nesting deeper than the parser's.
        answer = None
    if not isinstance(answer, dict):
        raise E2bError(502, "the sandbox did not answer the call (was its session restarted?)")
    return answer
