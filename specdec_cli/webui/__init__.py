"""`specdec ui`: a local web page to try a pair in a browser (page.py serves it; static/ holds the
page itself: HTML, CSS and plain JavaScript, every asset served from the package, none from a CDN).

Why Starlette under uvicorn and not Gradio (docs/ui.md, "Why not Gradio"): both already come
with the base install for `specdec serve`, so the page costs no install at all, where Gradio 6.31
adds 193 MB in 18 distributions to it (pandas, pillow, its own 80 MB frontend; measured with
`pip install --target`); and a page of our own shows the trace as the terminal does, token by
token, which a model demo's stock components do not."""
