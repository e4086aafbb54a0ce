"""``es-agents ui``: the web app (``es_agents.ui.app.make_app``)."""
