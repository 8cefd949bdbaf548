"""Models and datasets by Hugging Face Hub id (ORG/NAME): downloaded once into the Hub cache, read from it offline.

Both go through `huggingface_hub.snapshot_download`, which downloads what is missing, returns the cached snapshot
directory, and under HF_HUB_OFFLINE=1 reads the cache only. The rest of the engine then sees a local directory,
exactly as when a path was given. Every failure becomes one line naming the id and the cause (not found, gated,
offline and not cached, unreachable), raised before the run does any work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .config import is_hub_id

# Weights in formats transformers does not load here, and duplicates some repositories ship beside safetensors.
MODEL_IGNORE_PATTERNS = ["*.pth", "*.pt", "*.gguf", "*.onnx", "*.msgpack", "*.h5", "*.ot", "original/*",
                         "consolidated*"]


class HubError(RuntimeError):
    pass


def resolve_model(name_or_path: str, revision: Optional[str] = None, key: str = "model.name_or_path") -> str:
    """A local directory as it is; a Hub id -> its snapshot directory in the Hub cache (downloaded if missing)."""
    if Path(name_or_path).expanduser().is_dir() or not is_hub_id(name_or_path):
        return str(Path(name_or_path).expanduser())
    return download(name_or_path, "model", revision, key, ignore_patterns=MODEL_IGNORE_PATTERNS)


def download(repo_id: str, repo_type: str, revision: Optional[str], key: str,
             ignore_patterns: Optional[list[str]] = None) -> str:
    """The snapshot directory of `repo_id` at `revision`, or a HubError that says why in one line."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError, \
        RevisionNotFoundError

    what = f"{key} {repo_id!r}" + (f" (revision {revision!r})" if revision else "")
    kind = "dataset" if repo_type == "dataset" else "model"
    try:
        return snapshot_download(repo_id, repo_type=repo_type, revision=revision, ignore_patterns=ignore_patterns)
    except GatedRepoError:  # before RepositoryNotFoundError, its base class
        raise HubError(f"{what}: a gated {kind} on the Hub; accept its terms on its Hub page, then log in "
                       f"(`hf auth login` or HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise HubError(f"{what}: no such {kind} on the Hub (check the id; a private one needs `hf auth login` "
                       f"or HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise HubError(f"{what}: the {kind} has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise HubError(f"{what}: not in the Hub cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set: "
                           f"download it once online, or unset HF_HUB_OFFLINE") from None
        raise HubError(f"{what}: not in the Hub cache ({constants.HF_HUB_CACHE}) and the Hub could not be "
                       f"reached: check the network, or set HF_ENDPOINT") from None


def load_hub_dataset(repo_id: str, config: Optional[str], split: str, key: str = "data.path") -> list[dict[str, Any]]:
    """The rows of one split of a Hub dataset (GSM8K's question / answer, MATH's problem / solution, ...), read by
    `datasets.load_dataset` from the repository's snapshot directory."""
    try:
        import datasets
    except ImportError:
        raise HubError(f"{key} {repo_id!r}: a Hub dataset is read with the `datasets` package: "
                       f"pip install datasets") from None
    directory = download(repo_id, "dataset", None, key)
    try:
        loaded = datasets.load_dataset(directory, name=config, split=split)
    except ValueError as exc:  # an unknown configuration or split: datasets lists the ones there are
        first_line = str(exc).strip().splitlines()[0]
        raise HubError(f"{key} {repo_id!r} (data.config {config!r}, split {split!r}): {first_line}") from None
    return loaded.to_list()
