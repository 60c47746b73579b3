"""HTML pages with inline SVG, read from the state view."""
