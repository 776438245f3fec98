"""``report.html``: the self-contained page of a build and its SVG charts."""
