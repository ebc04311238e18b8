"""The tests' real `specdec serve` process: specdec_cli/remote/local_server.LocalServer, which the
benches use too (one copy)."""

from specdec_cli.remote.local_server import LISTENING, ROOT, SPECDEC, LocalServer

Server = LocalServer

__all__ = ["LISTENING", "ROOT", "SPECDEC", "LocalServer", "Server"]
