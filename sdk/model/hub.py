"""Weight downloads: a local model directory first, then the Hugging Face Hub, with errors that say what to do.

Files are looked up in the model directory (`model_dir=` / `--model-dir` / `$DUETASPAN_MODEL_DIR`) as
`DIR/<file>` or `DIR/<repo-name>/<file>`; otherwise `huggingface_hub` downloads them into its cache with progress
bars (`HF_TOKEN` for the gated PersonaPlex repo). Access problems become `HubAccessError` with the fix spelled
out; nothing here retries or swallows errors.

Example:
    >>> from duetaspan.model.hub import fetch_preset_files
    >>> files = fetch_preset_files("duetaspan-7b", model_dir="/models")     # doctest: +SKIP
    >>> files.lm, files.mimi, files.tokenizer                               # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from duetaspan.errors import CheckpointError, ConfigError
from duetaspan.model.presets import FileSpec, Preset, get_preset

log = logging.getLogger(__name__)

MODEL_DIR_ENV = "DUETASPAN_MODEL_DIR"
_VOICE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class HubAccessError(CheckpointError):
    """A weight file could not be found locally nor downloaded; the message says how to fix it."""


@dataclass(frozen=True)
class ModelFiles:
    """Local paths of a preset's files (None where the preset builds the part itself)."""

    preset: Preset
    lm: Path | None
    mimi: Path | None
    tokenizer: Path | None
    model_dir: Path | None


def resolve_model_dir(model_dir: str | Path | None = None) -> Path | None:
    """The explicit directory, else `$DUETASPAN_MODEL_DIR`, else None; ConfigError if it does not exist."""
    value = model_dir if model_dir is not None else os.environ.get(MODEL_DIR_ENV) or None
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ConfigError(f"model directory {path} does not exist (from --model-dir or ${MODEL_DIR_ENV})")
    return path


def local_candidates(spec: FileSpec, model_dir: Path) -> list[Path]:
    """Where a file may sit in a model directory: flat, or under the repo's name."""
    repo_name = spec.repo.split("/")[-1]
    return [model_dir / spec.filename, model_dir / repo_name / spec.filename]


def fetch_file(
    spec: FileSpec,
    model_dir: str | Path | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """Path of `spec` on this machine: from the model directory, else downloaded from the Hub.

    Raises HubAccessError with an actionable message for gated/private repos, missing files and no network.
    """
    local_dir = resolve_model_dir(model_dir)
    if local_dir is not None:
        for candidate in local_candidates(spec, local_dir):
            if candidate.is_file():
                return candidate
        log.info("%s not in %s; trying the Hugging Face Hub", spec.filename, local_dir)
    return _download(spec, local_dir, token, endpoint, cache_dir)


def _download(
    spec: FileSpec,
    local_dir: Path | None,
    token: str | None,
    endpoint: str | None,
    cache_dir: str | Path | None,
) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    where = f"{spec.repo}/{spec.filename}"
    put_it = (
        f"or download it yourself and put it in {local_dir}"
        if local_dir is not None
        else f"or download it yourself into a folder and pass --model-dir DIR (serve, infer, check; or set "
        f"[model] dir in agent.toml or ${MODEL_DIR_ENV}); to try everything without weights: --model tiny-random"
    )
    url = f"https://huggingface.co/{spec.repo}"
    try:
        path = hf_hub_download(
            repo_id=spec.repo,
            filename=spec.filename,
            token=token if token is not None else (os.environ.get("HF_TOKEN") or None),
            endpoint=endpoint,
            cache_dir=str(cache_dir) if cache_dir is not None else None,
        )
    except GatedRepoError as exc:
        raise HubAccessError(
            f"{where}: {spec.repo} is gated; accept its licence at {url} while logged in, create a read token "
            f"and set HF_TOKEN=<token>, {put_it}"
        ) from exc
    except RepositoryNotFoundError as exc:
        hint = "accept the licence at " + url + " and set HF_TOKEN" if spec.gated else "check HF_TOKEN"
        raise HubAccessError(f"{where}: repository not found or not accessible ({hint}), {put_it}") from exc
    except EntryNotFoundError as exc:
        # LocalEntryNotFoundError subclasses it: offline and not cached
        if isinstance(exc, LocalEntryNotFoundError):
            # the Hub answered, but not with the file: report the HTTP status hf_hub_download wrapped
            status = _http_status(exc)
            if status in (401, 403):
                raise HubAccessError(
                    f"{where}: access denied (HTTP {status}); set HF_TOKEN to a token that can read {url}, "
                    f"{put_it}"
                ) from exc
            raise HubAccessError(
                f"{where}: not cached and the Hugging Face Hub cannot be reached (offline or HF_HUB_OFFLINE=1); "
                f"connect to the network, {put_it}"
            ) from exc
        raise HubAccessError(f"{where}: no such file in the repository, {put_it}") from exc
    except HfHubHTTPError as exc:
        status = _http_status(exc)
        if status in (401, 403):
            raise HubAccessError(
                f"{where}: access denied (HTTP {status}); set HF_TOKEN to a token that can read {url}, {put_it}"
            ) from exc
        raise HubAccessError(f"{where}: download failed ({exc.__class__.__name__}: {exc}), {put_it}") from exc
    except (OSError, ValueError) as exc:
        raise HubAccessError(f"{where}: download failed ({exc.__class__.__name__}: {exc}), {put_it}") from exc
    return Path(path)


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status behind an error, looking through the chain of causes."""
    seen: BaseException | None = exc
    while seen is not None:
        status = getattr(getattr(seen, "response", None), "status_code", None)
        if isinstance(status, int):
            return status
        seen = seen.__cause__ or seen.__context__
    return None


def fetch_preset_files(
    preset: str | Preset,
    model_dir: str | Path | None = None,
    token: str | None = None,
    endpoint: str | None = None,
) -> ModelFiles:
    """Fetch (or find) every file a preset needs: LM weights, Mimi, tokenizer."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    local_dir = resolve_model_dir(model_dir)

    def get(spec: FileSpec | None) -> Path | None:
        return None if spec is None else fetch_file(spec, local_dir, token, endpoint)

    return ModelFiles(
        preset=preset,
        lm=get(preset.lm),
        mimi=get(preset.mimi),
        tokenizer=get(preset.tokenizer),
        model_dir=local_dir,
    )


def voice_spec(preset: Preset, name: str) -> FileSpec:
    """The `voices/NAME.pt` file of a preset's voices repo; ConfigError for unsafe names or no voices."""
    if not _VOICE_NAME.match(name):
        raise ConfigError(f"voice name {name!r}: use letters, digits, '-' and '_' only, or pass a file path")
    if preset.voices_repo is None:
        raise ConfigError(f"preset {preset.name} has no voice presets; pass a .pt or .wav file as the voice")
    return FileSpec(repo=preset.voices_repo, filename=f"voices/{name}.pt")


def fetch_voice(
    preset: str | Preset,
    name: str,
    model_dir: str | Path | None = None,
    token: str | None = None,
    endpoint: str | None = None,
) -> Path:
    """Path of a named voice prompt (`voices/NAME.pt`), from the model directory or the Hub."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    return fetch_file(voice_spec(preset, name), model_dir, token, endpoint)
