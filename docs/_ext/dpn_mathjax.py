"""MathJax served by the site itself, from a PyPI package, so that the formulas render offline.

Sphinx's ``sphinx.ext.mathjax`` loads MathJax from a CDN by default: a reader without a network
(a classroom, a train, a firewall) would see raw LaTeX. The ``docs`` extra installs
``django-static-mathjax`` (MathJax 3.2, plain files, no Django needed at build time: only its
folder is read), and this extension copies the part a page uses into ``_static/mathjax/`` of the
build and points ``mathjax_path`` at it:

- ``es5/tex-chtml.js``: TeX input and CommonHTML output, the single script a page loads;
- ``es5/output/chtml/fonts/woff-v2/``: its fonts, loaded relative to the script;
- ``es5/input/tex/extensions/``: the TeX packages MathJax loads on demand (``\\color``, ...).

About 2 MB. The widget manager (ipywidgets' embed script and require.js) is not on PyPI, so the
tutorials' sliders are still loaded from a CDN: ``docs/tutorials.md`` says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ExtensionError

#: where the copy goes, relative to the build's ``_static``; ``mathjax_path`` is relative to it too
TARGET = "mathjax"
#: what is copied, relative to MathJax's ``es5`` folder
PARTS = ("tex-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions")


def mathjax_es5() -> Path:
    """MathJax's ``es5`` folder in the installed ``django-static-mathjax`` package."""
    try:
        import mathjax  # django-static-mathjax's package: MathJax under static/mathjax/
    except ImportError as error:
        raise ExtensionError(
            "dpn_mathjax: MathJax is not installed, so the docs would load it from a CDN. "
            'Fix: pip install -c constraints.txt -e ".[docs]" (it brings django-static-mathjax).'
        ) from error
    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (es5 / PARTS[0]).is_file():
        raise ExtensionError(f"dpn_mathjax: {es5 / PARTS[0]} is missing; reinstall django-static-mathjax.")
    return es5


def _configure(app: Sphinx, config: Config) -> None:
    mathjax_es5()  # fail early, naming the fix
    config.mathjax_path = f"{TARGET}/{PARTS[0]}"  # relative: under the build's _static


def _copy(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    es5, target = mathjax_es5(), Path(app.outdir) / "_static" / TARGET
    for part in PARTS:
        source, dest = es5 / part, target / part
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, dest, dirs_exist_ok=True)
        else:
            shutil.copy2(source, dest)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.mathjax")
    app.connect("config-inited", _configure)
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
