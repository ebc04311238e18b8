"""One checkpoint at a time: load a model or its processor, name a dtype, compare tokenizers.

The base the pair loader (models.py) and the server (remote/server.py) both build on. torch and
transformers are imported where a model is loaded, not at import time: the CLI checks flags,
paths and presets (and answers --version) without paying seconds of imports first.

The same `from_pretrained` path serves Qwen/Qwen2.5-Omni-3B / -7B and the bundled demo pair:
a full Qwen2.5-Omni checkpoint (model_type `qwen2_5_omni`, thinker + talker) is loaded as its
thinker only, by mapping the `thinker.` weight prefix away; a thinker-only folder (the demo pair)
loads directly; anything else goes through `AutoModelForCausalLM` (the loop does not care which
architecture it drives).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError, ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .processor import AudioTextProcessor

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "auto": "auto"}

# What the Hub accepts as a model id: `name` or `owner/name`, letters, digits, - _ . (no leading
# dot or slash). Anything else can only be a folder.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


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


def model_id(given: str) -> str:
    """A model folder by its absolute path (the same folder named from another directory is the
    same model); a Hub id as given."""
    path = Path(given)
    return str(path.resolve()) if "://" not in given and path.is_dir() else given


def check_model(ref: str, role: str = "model") -> None:
    """Refuse, in plain words and before anything loads, a model that is neither a folder holding
    a checkpoint nor something shaped like a Hub id (the Hub's own answer for a mistyped folder is
    "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"). ModelError, exit 1, as
    any model that cannot be loaded."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"the {role} folder {ref} holds no config.json, so it is not a model checkpoint; "
                             "give the folder that from_pretrained reads (config.json, weights, tokenizer)")
        return
    if path.exists():
        raise ModelError(f"the {role} {ref} is a file; give a model folder or a Hub id such as "
                         "Qwen/Qwen2.5-Omni-3B")
    # A bare name (no owner/) that is no folder here is a mistyped path far more often than one of the
    # Hub's few legacy ids (gpt2), none of which is a Qwen2.5-Omni thinker: say so, unless it is cached.
    bare = "/" not in ref and not _in_hub_cache(ref)
    if bare or not _HUB_ID.fullmatch(ref) or ref.startswith((".", "~")):
        raise ModelError(f"no such {role} folder: {ref}; check the path (or give a Hub id such as "
                         "Qwen/Qwen2.5-Omni-3B)")
    _check_hub_reachable(ref, role)


# How long the Hub may take to accept a connection before a Hub id is refused: without this check,
# from_pretrained retries for most of a minute and prints each retry.
HUB_CONNECT_S = 1.5


def _in_hub_cache(ref: str) -> bool:
    """Whether Hub id `ref` was downloaded before (from_pretrained then reads the cache, online or
    not). The cache's documented layout (models--OWNER--NAME/snapshots/REV/) read directly:
    try_to_load_from_cache answers the same, at the cost of importing the download API (httpx, 0.3 s)."""
    from huggingface_hub import constants  # the constants alone

    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{ref.replace('/', '--')}" / "snapshots"
    return any(snapshots.glob("*/config.json"))


def _check_hub_reachable(ref: str, role: str) -> None:
    """A Hub id that is not in the local cache needs the Hub: refused at once, in one line, when
    HF_HUB_OFFLINE is set or the Hub does not accept a connection within HUB_CONNECT_S."""
    from huggingface_hub import constants

    if _in_hub_cache(ref):
        return
    fix = f"give a local folder holding the checkpoint (e.g. after `hf download {ref}` on a machine with network)"
    if constants.HF_HUB_OFFLINE:
        raise ModelError(f"the {role} {ref} is a Hub id that is not in the local cache, and HF_HUB_OFFLINE is set; "
                         f"unset it to download, or {fix}")
    if not _reachable(constants.ENDPOINT, HUB_CONNECT_S):
        raise ModelError(f"the {role} {ref} is a Hub id, and the Hub ({constants.ENDPOINT}) cannot be reached; "
                         f"it needs the network, or {fix}")


def _reachable(url: str, timeout: float) -> bool:
    """Whether `url`'s host accepts a TCP connection within `timeout` seconds, name lookup included
    (getaddrinfo takes no timeout, so the attempt runs in a daemon thread that is left behind)."""
    import socket
    import threading
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.hostname is None:
        return True  # not ours to judge: from_pretrained says what is wrong with it
    port = parts.port or (443 if parts.scheme == "https" else 80)
    result: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((parts.hostname, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=attempt, daemon=True, name="specdec-hub-check")
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def load_model(path_or_id: str, device: str = "cpu", dtype: str = "float32") -> PreTrainedModel:
    """Load one model for decoding (eval mode, on `device`). Raises ModelError naming the path."""
    check_model(path_or_id)
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
    check_model(path_or_id)
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


def eos_ids_for(tokenizer) -> list[int]:
    """EOS and <|im_end|>: either ends the assistant's turn."""
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return sorted(i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id)
