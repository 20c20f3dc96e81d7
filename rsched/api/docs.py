"""/docs: a self-contained page (no CDN; the machine may be offline) that renders
/openapi.json and sends requests from a form for each operation.  Its script and style are
files beside the dashboard's (static/docs.js, static/docs.css): the Content-Security-Policy
every answer carries allows no inline script or style."""

DOCS_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rsched API</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<link rel="stylesheet" href="ui/docs.css">
</head><body>
<header><h1>rsched API</h1>
<input id="key" type="password" placeholder="API key (Bearer), kept in this browser"
 autocomplete="off">
<a href="openapi.json">openapi.json</a></header>
<main id="ops">Loading openapi.json...</main>
<script src="ui/docs.js"></script>
</body></html>
"""
