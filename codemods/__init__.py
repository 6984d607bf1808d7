"""porter rules, one per file, grouped by target. Installed as ``porter.codemods``."""
