"""The tests' real `specdec serve` process: specdec_cli/remote/local_server.LocalServer, which the
benches use too (one copy)."""

from specdec_cli.remote.local_server import LISTENING, ROOT, SPECDEC, LocalServer

Server = LocalServer


def wire_clip(sample, room: int):
    """A sample as protocol 3 sends it (wire.Clip: 16 kHz audio and the processor's prompt ids) and
    the in-process cloud-only answer's tokens (the oracle every verdict is checked against); the
    answer must hold at least `room` tokens."""
    from specdec_cli.audio import load_audio
    from specdec_cli.decoding import DecodingConfig
    from specdec_cli.describe import Describer
    from specdec_cli.models import load_pair
    from specdec_cli.remote import wire

    local = Describer(load_pair())
    audio = load_audio(sample, 16000, 30.0)
    prompt = local.pair.processor(audio)["input_ids"][0].tolist()
    data, codec = wire.encode_audio(audio, 16000)
    truth = local.run(audio, DecodingConfig(mode="cloud")).result.tokens
    assert len(truth) >= room, len(truth)
    return wire.Clip(data, codec, 16000, prompt), truth


def post_verify(url: str, request, timeout: float = 120):
    """One /v1/verify as MessagePack, on a connection of its own."""
    import httpx

    from specdec_cli.remote import wire

    return httpx.post(f"{url}/v1/verify", content=wire.encode(request), headers={"Content-Type": wire.MSGPACK},
                      timeout=timeout)


def verdict(response) -> dict:
    """A 200 verify answer, decoded."""
    import msgspec

    assert response.status_code == 200, response.text
    return msgspec.msgpack.decode(response.content)


__all__ = ["LISTENING", "ROOT", "SPECDEC", "LocalServer", "Server", "post_verify", "verdict", "wire_clip"]
