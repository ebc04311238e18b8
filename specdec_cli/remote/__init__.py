"""The cloud outside the process: `specdec serve` hosts the cloud thinker (server.py), the edge
reaches it through a session client (client.py) that offers the loop the same interface as the
in-process cloud; wire.py is the schema both ends share. `decoding/` knows nothing of this."""
