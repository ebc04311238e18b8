"""The pair loader: an edge and a cloud (the bundled demo pair for any not given), in this process
or the cloud on a `specdec serve` server, checked to share a tokenizer before any decoding.

One checkpoint at a time is checkpoints.py's (the server loads its cloud with the same calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoints import eos_ids_for, load_model, load_processor, same_tokenizer, same_tokenizer_files
from .errors import ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .decoding import VocabMasks
    from .decoding.gate import MeaningGate
    from .processor import AudioTextProcessor
    from .remote.client import RemoteClient

DEMO_DIR = Path(__file__).parent / "demo" / "models"
PRESETS_FILE = "specdec_presets.toml"


def demo_pair() -> tuple[str, str]:
    """Paths of the bundled demo edge and cloud checkpoints."""
    edge, cloud = DEMO_DIR / "edge", DEMO_DIR / "cloud"
    if not (edge / "config.json").exists() or not (cloud / "config.json").exists():
        raise ModelError(f"the bundled demo models are missing under {DEMO_DIR}; reinstall specdec "
                         "or pass --edge and --cloud")
    return str(edge), str(cloud)


def with_demo(edge: str | None, cloud: str | None) -> tuple[str, str]:
    """`edge` and `cloud`, the bundled demo pair's for any not given."""
    if edge is None or cloud is None:
        demo_edge, demo_cloud = demo_pair()
        edge, cloud = edge or demo_edge, cloud or demo_cloud
    return edge, cloud


@dataclass
class ModelPair:
    edge: PreTrainedModel
    cloud: PreTrainedModel | None      # None when the cloud is remote
    processor: AudioTextProcessor
    masks: VocabMasks
    eos_ids: list[int]
    edge_id: str
    cloud_id: str                      # a remote cloud: the model its server reports
    remote: RemoteClient | None = None  # --cloud http://…: the server hosting the cloud
    # The meaning gate of the presets files (their `[gate]` table), fitted on this pair's tokenizer;
    # None: none, or fitted on another tokenizer (verify="meaning" is then the entropy gate). It runs
    # on the edge, so a remote cloud changes nothing. Set by pair.Pair after loading.
    gate: MeaningGate | None = None
    # A --cloud URL that was down when the run started (its one-line error; settings.PairSpec): no
    # cloud at all, every clip described on the edge alone and marked so (describe.Describer).
    cloud_down: str | None = None

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @property
    def presets_file(self) -> Path | None:
        return presets_file_for(self.edge_id)


def presets_file_for(edge_id: str | None) -> Path | None:
    """A model folder may carry its own calibrated presets (the demo pair does); the edge's
    folder decides, since the threshold is read off the edge's entropies. None: the demo edge.
    Found without loading any model."""
    path = (Path(edge_id) if edge_id else DEMO_DIR / "edge") / PRESETS_FILE
    return path if path.is_file() else None


def load_pair(edge: str | None = None, cloud: str | None = None, device: str = "cpu",
              dtype: str = "float32", *, edge_device: str | None = None, cloud_device: str | None = None,
              cloud_info: dict[str, Any] | None = None, cloud_timeout: float | None = None,
              cloud_down: str | None = None) -> ModelPair:
    """Load edge and cloud (the bundled demo pair for any not given) and check they share a
    tokenizer before any decoding: speculative decoding compares token ids across models.
    `device` places both; `edge_device` / `cloud_device` place one each (a GPU each, or the
    edge on the CPU): token ids and logits rows cross between them, never hidden states.
    `cloud_info`: a remote cloud's /health as this run already read it (settings.PairSpec), so
    the server is asked once per run. `cloud_timeout`: seconds each request to a --cloud URL may
    take in all (None: $SPECDEC_CLOUD_TIMEOUT, else 60). `cloud_down`: the --cloud URL was down at
    the start (its error): the edge alone is loaded."""
    edge_device, cloud_device = edge_device or device, cloud_device or device
    edge, cloud = with_demo(edge, cloud)
    processor = load_processor(edge)
    if is_url(cloud) and cloud_down is not None:
        return _edge_alone(edge, cloud, processor, edge_device, dtype, cloud_down)
    if is_url(cloud):
        return _remote_pair(edge, cloud, processor, edge_device, dtype, cloud_info, cloud_timeout)
    cloud_tok = processor.tokenizer if same_tokenizer_files(edge, cloud) else load_processor(cloud).tokenizer
    if cloud_tok is not processor.tokenizer and not same_tokenizer(processor.tokenizer, cloud_tok):
        raise ModelError(f"edge {edge!r} and cloud {cloud!r} have different tokenizers "
                         f"({len(processor.tokenizer)} vs {len(cloud_tok)} tokens); pick a pair from one family")
    edge_model = load_model(edge, edge_device, dtype)
    cloud_model = load_model(cloud, cloud_device, dtype)
    vocab = cloud_model.get_output_embeddings().weight.shape[0]
    from .decoding.processors import VocabMasks as Masks  # lazy: transformers

    masks = Masks.for_tokenizer(processor.tokenizer, vocab)
    return ModelPair(edge_model, cloud_model, processor, masks, eos_ids_for(processor.tokenizer), edge, cloud)


def audio_window(edge: str | None) -> tuple[int, float] | None:
    """The rate (Hz) and the longest clip (s) the edge's feature extractor takes, read from its
    preprocessor_config.json without loading anything (the checks made before the models load);
    None when the folder (or the Hub cache) does not hold one."""
    import json

    edge, _ = with_demo(edge, "-")
    path: Path | str | None = Path(edge) / "preprocessor_config.json"
    if not Path(path).is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(edge, "preprocessor_config.json")
        except Exception:  # not a Hub id
            path = None
        if not isinstance(path, str):
            return None
    try:
        config = json.loads(Path(path).read_text())
        rate = int(config["sampling_rate"])
        samples = config.get("n_samples") or int(config["chunk_length"]) * rate
        return rate, float(samples) / rate
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the loader says what is wrong with it


def is_url(cloud: str | None) -> bool:
    """--cloud http://HOST:PORT: the cloud runs on a `specdec serve` server."""
    return bool(cloud) and cloud.lower().startswith(("http://", "https://"))


def remote_client(url: str, info: dict[str, Any] | None = None, timeout_s: float | None = None) -> RemoteClient:
    """A client for the server at `url` with its identity: `info` as already read (and checked
    by RemoteClient.health), else its /health (CloudUnreachable if down). `timeout_s`: the total
    deadline of each request (None: $SPECDEC_CLOUD_TIMEOUT, else 60)."""
    from .remote.client import RemoteClient

    client = RemoteClient(url, timeout_s=timeout_s)
    if info is None:
        client.health()
    else:
        client.info = dict(info)
    return client


def _remote_pair(edge: str, url: str, processor: AudioTextProcessor, device: str, dtype: str,
                 info: dict[str, Any] | None, timeout_s: float | None = None) -> ModelPair:
    """The edge here, the cloud on a server: same tokenizer (by fingerprint), the rules' masks at
    the cloud's vocabulary width as the server reports it."""
    from .decoding.processors import VocabMasks as Masks
    from .remote.wire import tokenizer_fingerprint

    client = remote_client(url, info, timeout_s)
    info = client.info
    if info.get("tokenizer") != tokenizer_fingerprint(processor.tokenizer):
        raise ModelError(f"the cloud at {url} ({info.get('model')}) has another tokenizer than edge {edge!r}; "
                         "pick a pair from one family")
    if int(info.get("rate", processor.sampling_rate)) != processor.sampling_rate:
        raise ModelError(f"the cloud at {url} hears {info.get('rate')} Hz, the edge {processor.sampling_rate} Hz")
    edge_model = load_model(edge, device, dtype)
    masks = Masks.for_tokenizer(processor.tokenizer, int(info["vocab"]))
    return ModelPair(edge_model, None, processor, masks, eos_ids_for(processor.tokenizer), edge,
                     client.model_id, remote=client)


def _edge_alone(edge: str, url: str, processor: AudioTextProcessor, device: str, dtype: str,
                why: str) -> ModelPair:
    """The edge without its cloud (`url` was down at the start: `why`): the rules' masks at the
    edge's own vocabulary width, the only one there is."""
    from .decoding.processors import VocabMasks as Masks

    edge_model = load_model(edge, device, dtype)
    masks = Masks.for_tokenizer(processor.tokenizer, edge_model.get_output_embeddings().weight.shape[0])
    return ModelPair(edge_model, None, processor, masks, eos_ids_for(processor.tokenizer), edge, url,
                     cloud_down=why)


# Set by `specdec --threads N`: the user's choice, which `one_thread_if_tiny` leaves alone.
threads_pinned = False
TINY_PARAMS = 20_000_000


def pin_threads(threads: int) -> None:
    """torch's CPU threads, as the user chose them (--threads): kept for tiny pairs too."""
    global threads_pinned
    import torch

    torch.set_num_threads(threads)
    threads_pinned = True


def pinned_threads() -> int | None:
    """The --threads this process runs with (None: torch's own choice), for Ray workers."""
    if not threads_pinned:
        return None
    import torch

    return torch.get_num_threads()


def one_thread_if_tiny(pair: ModelPair) -> None:
    """One torch thread when both models are tiny and on the CPU (the demo pair: 0.2M + 2.3M parameters).
    Their matmuls are a few thousand multiply-adds, less work than waking and joining a pool of
    threads, which on a busy machine also wait for cores; measured for docs/usage.md, "Start-up"."""
    local = [m for m in (pair.edge, pair.cloud) if m is not None]
    if threads_pinned or any(m.device.type != "cpu" for m in local):
        return
    if sum(p.numel() for m in local for p in m.parameters()) <= TINY_PARAMS:
        import torch

        torch.set_num_threads(1)
