"""The web UI: sessions, conversation trees, GRPO groups and a run's curves, in the browser.

`areal-proxy serve` serves it at `/ui` beside the API; `areal-proxy ui --db URL --run-dir DIR`
serves it alone over any store (a finished run's, or a live one's, read beside its proxy). The
pages are plain HTML, CSS and ES modules under `static/`, shipped as package data: nothing is
built at install time. They read JSON from `/ui/api/...` (`routes.py`), which needs the admin key
when one is set; the static files are public.
"""
