"""The status page (/ui): server-rendered HTML for on-call, read-only, refreshing itself.

routes.py serves it, views.py gathers what each page shows, session.py signs the login cookie,
templates/ holds the Jinja2 templates (package data, read with importlib.resources)."""
