"""The Python programs an E2B sandbox runs for envd's calls (filesystem, commands), as runs in
its session: each binds no name in the session (its code runs in a namespace of its own) and
answers with its trailing expression, a JSON string, read back from the runner's verified
result. E2B's home /home/user is the session's work directory /tmp/work."""

import ast
import hashlib
import json
from typing import Any

from sandpod_gateway.families.e2b.protocol import HOME, MAX_ANSWER_BYTES, MAX_DISPLAYS, E2bError

WORK_DIR = "/tmp/work"

_FILESYSTEM = r"""
import os, json, shutil, stat as st, datetime
def real(p):
    if p == HOME or p.startswith(HOME + "/"):
        return WORK + p[len(HOME):]
    return os.path.normpath(p if p.startswith("/") else os.path.join(WORK, p))
def shown(p):
    return HOME + p[len(WORK):] if p == WORK or p.startswith(WORK + "/") else p
def kind(mode):
    return "FILE_TYPE_DIRECTORY" if st.S_ISDIR(mode) else "FILE_TYPE_FILE"
def entry(p):
    s = os.lstat(p)
    when = datetime.datetime.fromtimestamp(s.st_mtime, datetime.timezone.utc)
    e = {"name": os.path.basename(p.rstrip("/")) or "/", "type": kind(s.st_mode),
         "path": shown(p), "size": str(s.st_size), "mode": s.st_mode & 0o7777,
         "permissions": st.filemode(s.st_mode), "owner": str(s.st_uid),
         "group": str(s.st_gid), "modifiedTime": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    if st.S_ISLNK(s.st_mode):
        # As envd: a symlink has its target's type and mode, and the target's resolved path.
        e["symlinkTarget"] = shown(os.path.realpath(p))
        try:
            target = os.stat(p)
            e["type"], e["mode"] = kind(target.st_mode), target.st_mode & 0o7777
        except OSError:
            e["type"] = "FILE_TYPE_UNSPECIFIED"
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
            # A path that is not there is removed already (envd's answer too).
            p = real(a["path"])
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            elif os.path.lexists(p):
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


# The code interpreter's helper, kept in the session's interpreter as the module _sandpod_e2b:
# one run per cell (environment, the context's namespace and directory, the cell compiled as
# <cell CONTEXT:N>, its trailing value and display() calls with their rich representations),
# and the contexts. It answers each call with ONE JSON value (its repr is the JSON text), sized
# to fit the runner's 64 KiB value. The gateway sends it only when the session lacks it or has
# another version (SESSION_MODULE_VERSION, a hash of its source).
SESSION_MODULE = r"""
import ast, base64, builtins, json, linecache, os, sys, traceback

HOME = {home!r}
WORK = {work!r}
# The answer is the run's trailing value, which the runner keeps up to 64 KiB; this leaves room.
BUDGET = {budget!r}
MAX_DISPLAYS = {max_displays!r}
MAX_TRACEBACK = 16000
FORMATS = (
    ("_repr_html_", "html"), ("_repr_markdown_", "markdown"), ("_repr_svg_", "svg"),
    ("_repr_png_", "png"), ("_repr_jpeg_", "jpeg"), ("_repr_pdf_", "pdf"),
    ("_repr_latex_", "latex"), ("_repr_json_", "json"), ("_repr_javascript_", "javascript"),
)
BINARY = frozenset({"png", "jpeg", "pdf"})


class Answer(str):
    # Its repr is itself: the run's value is the JSON text as it is.
    def __repr__(self):
        return str(self)


def note(message):
    try:
        print("sandpod: " + message, file=sys.stderr)
    except Exception:
        pass


def fresh():
    return {"__name__": "__main__", "__builtins__": builtins}


main = sys.modules["__main__"].__dict__
contexts = {"default": {"globals": main, "cwd": WORK, "count": 0, "language": "python"}}
shown = []
dropped = []


def path_shown(p):
    return HOME + p[len(WORK):] if p == WORK or p.startswith(WORK + "/") else p


def described(cid):
    c = contexts[cid]
    return {"id": cid, "language": c["language"], "cwd": path_shown(c["cwd"])}


def figure_png(value):
    # A matplotlib figure is saved as the run's output file, as plt.show() does.
    mpl = sys.modules.get("sandpod_mpl")
    figure = sys.modules.get("matplotlib.figure")
    if mpl is None or figure is None or not isinstance(value, figure.Figure):
        return False
    try:
        mpl.save(value)
        return True
    except Exception as error:
        note(f"a figure could not be saved: {type(error).__name__}: {error}")
        return False


def plain(value):
    # A plotted value as JSON: a finite number, else its text (a category, a date).
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if number == number and abs(number) != float("inf") else None


def axis(ax, name):
    get = lambda what: getattr(ax, f"get_{name}{what}")()
    return {
        f"{name}_label": get("label") or None,
        f"{name}_unit": None,
        f"{name}_ticks": [plain(t) for t in get("ticks")],
        f"{name}_tick_labels": [t.get_text() for t in get("ticklabels")],
        f"{name}_scale": get("scale"),
    }


def axes_chart(ax):
    # One Axes as E2B's chart: bars, a pie, lines or points; None for anything else.
    title = ax.get_title()
    bars = [c for c in ax.containers if type(c).__name__ == "BarContainer"]
    if bars:
        labels = {plain(t): l.get_text() for t, l in zip(ax.get_xticks(), ax.get_xticklabels())}
        elements = []
        for container in bars:
            for bar in container.patches:
                x = plain(bar.get_x() + bar.get_width() / 2)
                elements.append({"label": labels.get(x, str(x)), "group": container.get_label(),
                                 "value": plain(bar.get_height())})
        return {"type": "bar", "title": title, "elements": elements,
                "x_label": ax.get_xlabel() or None, "y_label": ax.get_ylabel() or None,
                "x_unit": None, "y_unit": None}
    wedges = [p for p in ax.patches if type(p).__name__ == "Wedge"]
    if wedges:
        elements = [{"label": w.get_label(), "angle": plain(w.theta2 - w.theta1),
                     "radius": plain(w.r)} for w in wedges]
        return {"type": "pie", "title": title, "elements": elements}
    lines = [l for l in ax.get_lines() if len(l.get_xdata())]
    points = [c for c in ax.collections if type(c).__name__ == "PathCollection"]
    if lines or points:
        elements = [{"label": l.get_label(),
                     "points": [[plain(x), plain(y)] for x, y in zip(l.get_xdata(), l.get_ydata())]}
                    for l in lines]
        elements += [{"label": c.get_label(), "points": [[plain(x), plain(y)]
                      for x, y in c.get_offsets()]} for c in points]
        kind = "line" if lines else "scatter"
        return {"type": kind, "title": title, "elements": elements, **axis(ax, "x"),
                **axis(ax, "y")}
    return None


def chart(figure):
    try:
        charts = [c for c in map(axes_chart, figure.get_axes()) if c is not None]
        if len(charts) > 1:
            title = figure.get_suptitle() if hasattr(figure, "get_suptitle") else ""
            return {"type": "superchart", "title": title, "elements": charts}
        return charts[0] if charts else None
    except Exception as error:
        note(f"a figure's chart could not be read: {type(error).__name__}: {error}")
        return None


def charts_saved():
    # The charts of the figures this cell saved (shown, a Figure value, or left open), by the
    # name of their file.
    mpl = sys.modules.get("sandpod_mpl")
    saved = getattr(mpl, "saved", None)
    if saved is None:
        return {}
    try:
        mpl.flush()
    except Exception as error:
        note(f"the figures left open could not be saved: {type(error).__name__}: {error}")
    found = {os.path.basename(path): chart(figure) for path, figure in saved}
    saved.clear()
    return {name: c for name, c in found.items() if c is not None}


def forget_saved():
    saved = getattr(sys.modules.get("sandpod_mpl"), "saved", None)
    if saved is not None:
        saved.clear()


def native(value):
    # A table's cell as JSON: numpy's scalars as Python's, a non-finite number as null,
    # anything else not JSON (a timestamp) as its text.
    if hasattr(value, "item"):
        try:
            value = value.item()
        except Exception:
            pass
    if isinstance(value, float) and (value != value or abs(value) == float("inf")):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def table_data(value):
    # A pandas DataFrame's columns (a Series: its one), as E2B's Result.data gives them.
    kind = type(value)
    if not kind.__module__.startswith("pandas"):
        return None
    if kind.__name__ == "Series":
        return {str(value.name): [native(v) for v in value.tolist()]}
    if kind.__name__ == "DataFrame":
        return {str(c): [native(v) for v in value[c].tolist()] for c in value.columns}
    return None


def bundle(value):
    try:
        text = repr(value)
    except Exception as error:
        text = f"<repr failed: {type(error).__name__}: {error}>"
    found = {"text": text}
    if isinstance(value, type) or figure_png(value):
        return found
    for method, key in FORMATS:
        try:
            make = getattr(value, method, None)
            if not callable(make):
                continue
            data = make()
        except Exception as error:
            note(f"{method} failed: {type(error).__name__}: {error}")
            continue
        if isinstance(data, tuple) and data:
            data = data[0]
        if data is None:
            continue
        if key in BINARY and isinstance(data, (bytes, bytearray)):
            data = base64.b64encode(bytes(data)).decode()
        if key == "json":
            if not isinstance(data, (dict, list)):
                continue
        elif not isinstance(data, str):
            continue
        found[key] = data
    try:
        table = table_data(value)
    except Exception as error:
        note(f"a table's data could not be read: {type(error).__name__}: {error}")
        table = None
    if table is not None:
        found["data"] = table
    return found


def display(*values, **_):
    if not shown or shown[-1] is None:
        for value in values:
            print(repr(value))
        return
    for value in values:
        if len(shown[-1]) >= MAX_DISPLAYS:
            dropped[-1] += 1
        else:
            shown[-1].append(bundle(value))


def size(value):
    return len(json.dumps(value, ensure_ascii=False).encode())


def fitted(results, error, charts):
    # What fits the answer: the error, then each result's text, then its representations in
    # order, then the figures' charts; what does not fit is dropped, saying so on stderr.
    left = BUDGET - 200
    if error is not None:
        if len(error["traceback"]) > MAX_TRACEBACK:
            error["traceback"] = "…" + error["traceback"][-MAX_TRACEBACK:]
        error["value"] = error["value"][:4000]
        left -= size(error)
    kept = []
    for number, result in enumerate(results, 1):
        main = result.pop("is_main_result")
        item = {"text": result.pop("text"), "is_main_result": main}
        cost = size(item) + 4
        if cost > left:
            note(f"result {number}: its text ({cost} bytes) does not fit the cell's answer "
                 f"(64 KiB), cut")
            text, cut = item["text"], max(0, left - 64)
            while True:
                item["text"] = text[:cut] + "…"
                cost = size(item) + 4
                if cost <= left or cut == 0:
                    break
                cut = cut * 3 // 4
        left -= cost
        for key, data in result.items():
            cost = size({key: data})
            if cost > left:
                note(f"result {number}: its {key} ({cost} bytes) does not fit the cell's "
                     f"answer (64 KiB, {max(left, 0)} bytes left), dropped")
                continue
            item[key] = data
            left -= cost
        kept.append(item)
    for name in list(charts):
        cost = size({name: charts[name]})
        if cost > left:
            note(f"the chart of {name} ({cost} bytes) does not fit the cell's answer (64 KiB), "
                 f"dropped")
            del charts[name]
        else:
            left -= cost
    return kept


def trailing(tree, source):
    # The last statement's expression, unless it ends with ';'.
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return None
    last = tree.body[-1]
    rest = source.splitlines(True)[last.end_lineno - 1:]
    if rest:
        rest[0] = rest[0].encode()[last.end_col_offset:].decode("utf-8", "replace")
    if "".join(rest).lstrip().startswith(";"):
        return None
    tree.body.pop()
    return ast.Expression(last.value)


def formatted(error, tb):
    return "".join(traceback.format_exception(type(error), error, tb))


def cell(args):
    cid = args.get("context") or "default"
    if cid not in contexts:
        return {"error": ["not_found", f"context {cid!r} not found"]}
    c = contexts[cid]
    c["count"] += 1
    count = c["count"]
    source = args["code"]
    filename = f"<cell {cid}:{count}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    envs = {**args.get("sandbox_envs", {}), **args.get("envs", {})}
    saved = {k: os.environ.get(k) for k in envs}
    here = os.getcwd()
    results, error = [], None
    shown.append(results)
    dropped.append(0)
    namespace = c["globals"]
    namespace.setdefault("display", display)
    forget_saved()
    try:
        os.environ.update(envs)
        os.chdir(c["cwd"])
        try:
            tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
            last = trailing(tree, source)
            body = compile(tree, filename, "exec", dont_inherit=True)
            value = None if last is None else compile(last, filename, "eval", dont_inherit=True)
        except SyntaxError as e:
            error = {"name": type(e).__name__, "value": str(e), "traceback": formatted(e, None)}
        else:
            try:
                exec(body, namespace)
                if value is not None:
                    value = eval(value, namespace)
                    if value is not None:
                        results.append({**bundle(value), "is_main_result": True})
            except BaseException as e:
                # The first entry is this frame; the cell's own start below it.
                tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
                error = {"name": type(e).__name__, "value": str(e), "traceback": formatted(e, tb)}
    finally:
        shown.pop()
        extra = dropped.pop()
        if extra:
            note(f"display(): at most {MAX_DISPLAYS} results a cell, {extra} more dropped")
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            c["cwd"] = os.getcwd()
            os.chdir(here)
        except OSError:
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    for r in results:
        r.setdefault("is_main_result", False)
    ordered = [r for r in results if not r["is_main_result"]]
    ordered += [r for r in results if r["is_main_result"]]
    charts = charts_saved()
    kept = fitted(ordered, error, charts)
    return {"results": kept, "error": error, "count": count, "charts": charts}


def create(args):
    cid = args["id"]
    cwd = args.get("cwd") or WORK
    if not os.path.isdir(cwd):
        return {"error": ["invalid_argument", f"cwd {path_shown(cwd)!r} is not a directory"]}
    contexts[cid] = {"globals": fresh(), "cwd": cwd, "count": 0, "language": "python"}
    return {"context": described(cid)}


def listed(args):
    return {"contexts": [described(cid) for cid in contexts]}


def restart(args):
    cid = args["id"]
    if cid not in contexts:
        return {"error": ["not_found", f"context {cid!r} not found"]}
    c = contexts[cid]
    if cid == "default":
        for name in [n for n in main if not (n.startswith("__") and n.endswith("__"))]:
            del main[name]
    else:
        c["globals"] = fresh()
    c["count"] = 0
    return {}


def remove(args):
    cid = args["id"]
    if contexts.pop(cid, None) is None:
        return {"error": ["not_found", f"context {cid!r} not found"]}
    return {}


CALLS = {"cell": cell, "create": create, "list": listed, "restart": restart, "remove": remove}


def call(op, args):
    try:
        answer = CALLS[op](args)
    except Exception as error:
        answer = {"error": ["internal", f"{type(error).__name__}: {error}"]}
    return Answer(json.dumps(answer, ensure_ascii=False))
"""
for _name, _value in {
    "home": HOME,
    "work": WORK_DIR,
    "budget": MAX_ANSWER_BYTES - 4096,
    "max_displays": MAX_DISPLAYS,
}.items():
    SESSION_MODULE = SESSION_MODULE.replace("{" + _name + "!r}", repr(_value))
SESSION_MODULE_NAME = "_sandpod_e2b"
SESSION_MODULE_VERSION = hashlib.sha256(SESSION_MODULE.encode()).hexdigest()[:16]
# What a call answers when the session lacks the module (or has another version).
MODULE_MISSING = "False"


def session_call(op: str, args: dict[str, Any], install: bool) -> str:
    """A run calling the session's _sandpod_e2b: `op` with `args` (JSON values); with install,
    the module is (re)installed first, else a session without it answers MODULE_MISSING."""
    call = f"m.call({op!r}, {args!r})"
    if not install:
        return (
            f"(lambda m: {call} if getattr(m, 'VERSION', None) == "
            f"{SESSION_MODULE_VERSION!r} else False)"
            f"(__import__('sys').modules.get({SESSION_MODULE_NAME!r}))"
        )
    return (
        f"(lambda s, m: (exec(compile({SESSION_MODULE!r}, '<{SESSION_MODULE_NAME}>', 'exec'), "
        f"m.__dict__), setattr(m, 'VERSION', {SESSION_MODULE_VERSION!r}), "
        f"s.modules.__setitem__({SESSION_MODULE_NAME!r}, m), {call})[-1])"
        f"(__import__('sys'), type(__import__('sys'))({SESSION_MODULE_NAME!r}))"
    )
