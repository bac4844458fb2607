"""The sandpod python image's matplotlib backend: figures come back as PNG files.

Selected by the catalog's env (MPLBACKEND=module://sandpod_mpl). Drawing is matplotlib's
Agg; `plt.show()` (and `Figure.show()`) saves every open figure as
$SANDPOD_OUTPUTS/figure-<n>.png (n = 1, 2, ... in the order they are saved) and closes it,
and figures still open when the program exits are saved the same way. The runner brings
the files in $SANDPOD_OUTPUTS back with the result. A session's kernel calls `flush()`
after each run. `saved` keeps the last figures saved with their files, for a session's code
interpreter to describe them (E2B's charts).
"""

import atexit
import itertools
import os
from collections import deque

from matplotlib._pylab_helpers import Gcf
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_numbers = itertools.count(1)
saved: deque[tuple[str, Figure]] = deque(maxlen=16)


def _outputs_dir() -> str:
    directory = os.environ.get("SANDPOD_OUTPUTS", "/tmp/outputs")
    os.makedirs(directory, exist_ok=True)
    return directory


def _next_path() -> str:
    directory = _outputs_dir()
    while True:
        path = os.path.join(directory, f"figure-{next(_numbers)}.png")
        if not os.path.exists(path):
            return path


def save(figure: Figure) -> str:
    """Save one figure as the next figure-<n>.png; its path."""
    path = _next_path()
    figure.savefig(path, format="png")
    saved.append((path, figure))
    return path


def flush() -> list[str]:
    """Save every open figure, in the order of their numbers, and close them all."""
    managers = sorted(Gcf.get_all_fig_managers(), key=lambda manager: manager.num)
    saved = [save(manager.canvas.figure) for manager in managers]
    Gcf.destroy_all()
    return saved


class FigureManager(FigureManagerBase):
    def show(self) -> None:
        """Figure.show(): save this figure and close it."""
        save(self.canvas.figure)
        Gcf.destroy(self)


class FigureCanvas(FigureCanvasAgg):
    manager_class = FigureManager


def show(*args: object, **kwargs: object) -> None:
    """pyplot.show(): nothing to display; every open figure becomes a file."""
    flush()


atexit.register(flush)
