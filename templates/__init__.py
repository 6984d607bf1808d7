"""Jinja2 templates (reports, rule docs). Installed as ``porter.templates``."""
