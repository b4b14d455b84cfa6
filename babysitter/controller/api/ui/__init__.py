"""The status page (/ui): server-rendered HTML for on-call, read-only, refreshing itself.

routes.py serves it, ../fleet_view.py builds the fleet page's snapshot once per loop tick,
views.py gathers what a node's page shows, session.py signs the login cookie,
templates/ holds the Jinja2 templates (package data, read with importlib.resources)."""
