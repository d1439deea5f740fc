"""User settings: defaults, the TOML file in the data folder, and command-line overrides.

Validation is pydantic's; its reasons are turned into one line that names the key, the
problem and the file, so a typo in config.toml never shows a traceback.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from chatapp.errors import SettingsError


class Settings(BaseModel):
    """Everything a user can tune; every field has a default that suits a laptop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Path | None = Field(
        None,
        description="GGUF model file, or a model's name as `chatapp models` lists it (llama3.2:3b); "
        "empty means the bundled SmolLM2-135M",
    )
    model_folders: str | None = Field(
        None,
        description="more folders to look for GGUF models in, besides Ollama's, LM Studio's, the Hugging Face "
        "cache and llama.cpp's, separated by ':' (';' on Windows)",
    )
    context_cap: int = Field(8192, ge=256, description="largest context per conversation, in tokens")
    sequences: int = Field(4, ge=1, le=64, description="conversations resident in the llama.cpp context")
    n_gpu_layers: int = Field(
        -1, ge=-1, description="layers offloaded to the GPU; -1 means all when the build has a GPU"
    )
    threads: int | None = Field(None, ge=1, description="CPU threads; empty means one per core")
    flash_attention: Literal["auto", "on", "off"] = Field(
        "auto",
        description="llama.cpp's flash attention; auto measures it once per model and machine and turns it on "
        "where it is clearly faster, except in a server whose several clients' answers batch and for models "
        "that are not plain KV (sliding-window, recurrent, hybrid: off there); on, "
        "restores stay exact, but each answer computes its last 64 prompt tokens again, prompts under 64 tokens "
        "are not reused and several clients' answers are decoded one at a time",
    )
    kv_type: Literal["f16", "q8_0", "q4_0"] = Field(
        "f16",
        description="the number format of the model's KV cache: q8_0 holds each token's state in about half the "
        "bytes of f16 and q4_0 in about a quarter, so the cache keeps two to four times the prefixes and restores "
        "move less; answers stay exact against a cold run of the same type but differ a little from f16's; a "
        "quantized type turns flash attention on",
    )
    batch_answers: bool = Field(
        True,
        description="answers streaming at once share one llama.cpp decode per token, where a probe at load finds "
        "that bit-exact (Q4_0, Q4_1, Q5_0, Q8_0 and most K-quant files, flash attention off); off decodes each alone",
    )
    prompt_batches: Literal["auto", "grid", "free"] = Field(
        "auto",
        description="where prompt batches end: auto probes the model at load and computes prompts in fixed "
        "64-token batches where its results depend on the split (Gemma 3 on many CPUs, any GPU), so every reuse "
        "equals a cold run; grid always; free never (faster reuse, a near tie may then answer otherwise)",
    )
    temperature: float = Field(0.7, ge=0.0, le=5.0, description="0 is greedy and reproducible")
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    max_tokens: int = Field(512, ge=1, description="longest answer, in tokens")
    seed: int | None = Field(None, ge=0, description="sampling seed; empty means a random one")
    cache_block_size: int = Field(64, ge=16, le=4096, description="tokens per cached KV block")
    cache_ram_mib: int = Field(2048, ge=0, description="RAM tier budget, in MiB")
    cache_disk_mib: int = Field(10240, ge=0, description="disk tier budget, in MiB")
    cache_ttl_days: float = Field(7.0, gt=0, description="cached blocks unused this long expire")
    cache_eviction: Literal["value", "lru", "lfu"] = Field(
        "value",
        description="what the RAM tier drops when full: value (the block cheapest to recompute per byte for its "
        "recent uses, leaves of the prefix tree first), lru (least recently used) or lfu (least often used); "
        "the disk tier drops least recently used",
    )
    cache_checks: int = Field(
        20,
        ge=0,
        le=1_000_000,
        description="check one answer in this many that reused cached KV: in idle time its prompt is computed "
        "again without the cache and the next token's logits compared bit for bit; a difference stops reuse for "
        "this model and build until `chatapp cache verify --clear` (0: never; each check costs one full prompt's "
        "compute, given up when a request comes)",
    )
    swa_full: bool = Field(
        False,
        description="sliding-window models (Gemma 3, gpt-oss): keep every token's window KV, so a conversation "
        "can be cut anywhere in place, but every window layer then attends over the whole context (Gemma 3 "
        "270M: a 20,190-token prompt 154 s against 62 s off); off (the default) keeps about one window per "
        "conversation and rewinds to checkpoints instead; answers are exact either way",
    )
    checkpoint_every_blocks: int = Field(
        16,
        ge=1,
        le=4096,
        description="sliding-window and recurrent models: keep the state every this many cache blocks of a long "
        "prompt, besides the persona, document and turn ends (smaller: reuse nearer any point, more storage)",
    )

    backend: str | None = Field(
        None,
        description="a server to answer instead of a model here (llama-server or another chatapp serve), "
        "e.g. http://gpu-box:8080; empty runs the model in this process",
    )
    backend_key: str | None = Field(None, description="the backend server's API key, if it needs one")
    backend_model: str | None = Field(None, description="the name to show for the backend's model")
    warm_ahead: bool = Field(
        True,
        description="compute a conversation's, persona's or document's beginning when it opens, and the "
        "message as you type, so Enter leaves little to compute (on a backend: prefill-only requests)",
    )

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_is_an_http_url(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                return None
            if not value.startswith(("http://", "https://")):
                raise ValueError(f"{value!r} is not an http:// or https:// address; give the server's URL")
        return value

    @field_validator("flash_attention", mode="before")
    @classmethod
    def _true_is_on(cls, value: object) -> object:
        """Files written before `auto` say true or false."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("model", "model_folders", "backend_key", "backend_model", mode="before")
    @classmethod
    def _empty_means_unset(cls, value: object) -> object:
        """An empty value is the default: the bundled model, no key, the server's own model name."""
        return None if isinstance(value, str) and not value.strip() else value


def describe_validation_error(error: ValidationError, source: str) -> str:
    """pydantic's first reason as one line: `source: key: reason`."""
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"]) or "(root)"
    reason = first["msg"]
    if first["type"] == "extra_forbidden":
        reason = "unknown setting (check its spelling, or remove it)"
    more = len(error.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {location}: {reason}{suffix}"


def load_settings(config_file: Path | None, overrides: dict[str, Any] | None = None) -> Settings:
    """Read `config_file` if it exists, apply non-None `overrides`, and validate."""
    values: dict[str, Any] = {}
    if config_file is not None and config_file.exists():
        try:
            values = tomllib.loads(config_file.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as error:
            raise SettingsError(f"{config_file}: not valid TOML ({error}); fix the file or delete it") from None
        except (OSError, UnicodeDecodeError) as error:
            raise SettingsError(f"{config_file}: cannot read it ({error}); fix its permissions or delete it") from None
        try:
            Settings.model_validate(values)
        except ValidationError as error:
            raise SettingsError(describe_validation_error(error, str(config_file))) from None
    values.update({key: value for key, value in (overrides or {}).items() if value is not None})
    try:
        return Settings.model_validate(values)
    except ValidationError as error:
        raise SettingsError(describe_validation_error(error, "command line")) from None
