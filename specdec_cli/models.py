"""Loading the edge/cloud pair and their shared processor.

The same `from_pretrained` path serves Qwen/Qwen2.5-Omni-3B / -7B and the bundled demo pair:
a full Qwen2.5-Omni checkpoint (model_type `qwen2_5_omni`, thinker + talker) is loaded as its
thinker only, by mapping the `thinker.` weight prefix away; a thinker-only folder (the demo pair)
loads directly; anything else goes through `AutoModelForCausalLM` (the loop does not care which
architecture it drives).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError, ModelError

# torch and transformers are imported where models are loaded, not at import time: the CLI checks
# flags, paths and presets (and answers --version) without paying seconds of imports first.
if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .decoding import VocabMasks
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


_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "auto": "auto"}


def dtype_name(name: str) -> str:
    """The canonical name of a --dtype value (float32, bfloat16, float16, auto); InputError for
    anything else. Without importing torch, so a bad flag or a refused batch answers at once."""
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise InputError(f"unknown dtype {name!r}; use one of float32, bfloat16, float16, auto") from None


def parse_dtype(name: str) -> Any:
    """A torch dtype (or "auto") for a --dtype value; InputError for anything else."""
    canonical = dtype_name(name)
    if canonical == "auto":
        return canonical
    import torch

    return getattr(torch, canonical)


def load_model(path_or_id: str, device: str = "cpu", dtype: str = "float32") -> PreTrainedModel:
    """Load one model for decoding (eval mode, on `device`). Raises ModelError naming the path."""
    from .fast_imports import import_transformers

    import_transformers()
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2_5OmniThinkerForConditionalGeneration

    try:
        config = AutoConfig.from_pretrained(path_or_id)
        kwargs = {"dtype": parse_dtype(dtype)}
        if config.model_type == "qwen2_5_omni":
            # Full Omni checkpoint: load just the thinker (the talker speaks; we only read text).
            model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
                path_or_id, config=config.thinker_config, key_mapping={r"^thinker\.": ""}, **kwargs)
        elif config.model_type == "qwen2_5_omni_thinker":
            model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(path_or_id, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(path_or_id, **kwargs)
        return model.to(device).eval()
    except (ModelError, InputError):
        raise
    except Exception as exc:  # from_pretrained raises many types; the user needs the path and the cause
        raise ModelError(f"cannot load model {path_or_id!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc


def load_processor(path_or_id: str) -> AudioTextProcessor:
    from .fast_imports import import_transformers

    import_transformers()  # before .processor imports transformers: one scan of its models folder
    from .processor import AudioTextProcessor

    try:
        return AudioTextProcessor.from_pretrained(path_or_id)
    except Exception as exc:
        raise ModelError(f"cannot load the tokenizer/feature extractor of {path_or_id!r}: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc


def same_tokenizer(a, b) -> bool:
    """Same vocabulary (token -> id) and the same special tokens."""
    return a.get_vocab() == b.get_vocab() and a.all_special_tokens == b.all_special_tokens


# Every file AutoTokenizer may read to build a tokenizer (fast, slow, added and special tokens).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "vocab.txt",
                   "tokenizer.model", "added_tokens.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json")


def same_tokenizer_files(a: str, b: str) -> bool:
    """Two local folders whose tokenizer files are byte-identical (and present in both or neither)
    load the same tokenizer, so the cloud's need not be loaded just to be compared (a Qwen
    tokenizer takes about a second). Anything else (a Hub id, a missing or differing file): False,
    and the caller loads and compares."""
    da, db = Path(a), Path(b)
    if not (da.is_dir() and db.is_dir()):
        return False
    found = False
    for name in TOKENIZER_FILES:
        fa, fb = da / name, db / name
        if fa.is_file() != fb.is_file():
            return False
        if fa.is_file():
            if fa.stat().st_size != fb.stat().st_size or fa.read_bytes() != fb.read_bytes():
                return False
            found = True
    return found


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


def eos_ids_for(tokenizer) -> list[int]:
    """EOS and <|im_end|>: either ends the assistant's turn."""
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return sorted(i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id)


def load_pair(edge: str | None = None, cloud: str | None = None, device: str = "cpu",
              dtype: str = "float32", *, edge_device: str | None = None, cloud_device: str | None = None,
              cloud_timeout: float | None = None) -> ModelPair:
    """Load edge and cloud (the bundled demo pair for any not given) and check they share a
    tokenizer before any decoding: speculative decoding compares token ids across models.
    `device` places both; `edge_device` / `cloud_device` place one each (a GPU each, or the
    edge on the CPU): token ids and logits rows cross between them, never hidden states.
    `cloud_timeout`: seconds each request to a --cloud URL may take in all (None: $SPECDEC_CLOUD_TIMEOUT, else 60)."""
    edge_device, cloud_device = edge_device or device, cloud_device or device
    if edge is None or cloud is None:
        demo_edge, demo_cloud = demo_pair()
        edge, cloud = edge or demo_edge, cloud or demo_cloud
    processor = load_processor(edge)
    if is_url(cloud):
        return _remote_pair(edge, cloud, processor, edge_device, dtype, cloud_timeout)
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


def is_url(cloud: str | None) -> bool:
    """--cloud http://HOST:PORT: the cloud runs on a `specdec serve` server."""
    return bool(cloud) and cloud.lower().startswith(("http://", "https://"))


def remote_client(url: str, timeout_s: float | None = None) -> RemoteClient:
    """A client for the server at `url`, its identity read (/health): CloudUnreachable if down."""
    from .remote.client import RemoteClient

    client = RemoteClient(url, timeout_s=timeout_s)
    client.health()
    return client


def _remote_pair(edge: str, url: str, processor: AudioTextProcessor, device: str, dtype: str,
                 timeout_s: float | None = None) -> ModelPair:
    """The edge here, the cloud on a server: same tokenizer (by fingerprint), the rules' masks at
    the cloud's vocabulary width as the server reports it."""
    from .decoding.processors import VocabMasks as Masks
    from .remote.wire import tokenizer_fingerprint

    client = remote_client(url, timeout_s)
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


# Set by `specdec --threads N`: the user's choice, which `one_thread_if_tiny` leaves alone.
threads_pinned = False
TINY_PARAMS = 20_000_000


def one_thread_if_tiny(pair: ModelPair) -> None:
    """One torch thread when both models are tiny and on the CPU (the demo pair: 0.2M + 2.3M parameters).
    Their matmuls are a few thousand multiply-adds, less work than waking and joining a pool of
    threads, which on a busy machine also wait for cores; measured in the README's start-up note."""
    local = [m for m in (pair.edge, pair.cloud) if m is not None]
    if threads_pinned or any(m.device.type != "cpu" for m in local):
        return
    if sum(p.numel() for m in local for p in m.parameters()) <= TINY_PARAMS:
        import torch

        torch.set_num_threads(1)
