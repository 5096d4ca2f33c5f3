"""The dashboard at ``/ui``: one page (``dashboard.html``: HTML, CSS, script, inline
SVG plots; no CDN, no build step) over one JSON endpoint, fed by a sampler of rates and
lag (``sampler.py``), a cached view of the job runs (``job_runs_view.py``) and the
broker's health with its service rows (``health.py``); ``overview.py`` builds the
document, ``routes.py`` serves it and signs in."""
