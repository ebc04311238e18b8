"""`specdec ui`: the pair in a browser page (specdec_cli/webui), on loopback unless --host says."""

from __future__ import annotations

from typing import Annotated

import typer

from . import ui
from .app import Interrupted
from .describe import cloud_down_note, load, spec_of
from .options import (
    DESCRIBE_DEADLINE_S,
    MODELS,
    DescribeDeadlineOpt,
    Models,
    OnCloudFailure,
    OnCloudFailureOpt,
    PresetsFileOpt,
    cloud_deadline,
    with_options,
)

DEFAULT_PORT = 7860  # the port model demos are usually tried on; --port 0 takes any free one


@with_options(MODELS)
def web(
    host: Annotated[str, typer.Option(help="Address to listen on. Loopback (the default) is this machine alone; any "
                                      "other address opens the page, and the models, to whoever reaches it, with no "
                                      "token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one; the start line says "
                                      "which).")] = DEFAULT_PORT,
    preset: Annotated[str, typer.Option(help="The preset the page starts with (the page lists them all).",
                                        rich_help_panel="Decoding")] = "fluent",
    presets_file: PresetsFileOpt = None,
    on_cloud_failure: OnCloudFailureOpt = OnCloudFailure.edge,
    deadline_s: DescribeDeadlineOpt = None,
    *, models: Models,
) -> None:
    """Try the pair in a browser: record your voice or upload a clip, choose a preset, and watch the
    sentence appear with each block's drafts and the cloud's verdicts, as the trace shows them.

    Serves a page on http://127.0.0.1:PORT until Ctrl-C; open it in a browser on this machine. Clips go
    through the same checks as with `specdec describe` (formats, at most 30 s for the demo pair, no
    silence), one at a time. With --cloud http://HOST:PORT the page uses that `specdec serve`."""
    from ..remote.server import is_loopback, listen
    from ..webui.page import Page, serve

    spec = spec_of(models, presets_file, on_cloud_failure.value,
                   cloud_deadline(deadline_s, on_cloud_failure, DESCRIBE_DEADLINE_S))
    spec.settings(preset)  # an unknown preset fails here, before the models load
    err = ui.console()
    if not is_loopback(host):
        err.print(f"warning: listening on {host}: anyone who reaches this port can use the page and the models "
                  "(it asks for no token); browsers allow the microphone only on 127.0.0.1, localhost or https, so "
                  "elsewhere the page takes uploads only", markup=False, style="yellow", soft_wrap=True)
    sock = listen(host, port)  # a port in use: one line, before the models load
    try:
        pair = load(spec, err)
    except KeyboardInterrupt:
        sock.close()
        raise Interrupted("while the models loaded: the page was not served") from None
    cloud_down_note(err, pair)

    def announce(url: str) -> None:
        err.print(f"specdec ui: open {url} in a browser (Ctrl-C stops it)", markup=False, soft_wrap=True)

    serve(Page(pair, preset), host, sock, announce)
    err.print("specdec ui: stopped", markup=False)

