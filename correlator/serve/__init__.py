"""`rootrank serve`: a local web page that diagnoses pasted or dropped logs with the `diagnose` engine.

`app` (routes, guards), `uploads` (the multipart body streamed to a temporary folder, checked as it comes),
`diagnosis` (the engine, the JSON and the pictures of `rootrank diagnose`, nothing of its own), `server`
(listening until stopped). Templates and the page's script and style ship as package data.
"""
