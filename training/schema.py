"""The config's types: dataclasses that Hydra's ConfigStore holds as the schema of configs/.

Types only (every field MISSING): the values, and their comments, live in the YAML presets, once.

configs/config.yaml and each group's YAML name their schema in their defaults list (`- /schema/...`),
so Hydra checks every key and type when it composes: an unknown key or `lr=abc` is refused naming
the field, before train() runs. The YAML files stay the presets and carry the comments; checks
that span fields (batch_size divisible by grad_accum, min_lr <= lr, ...) are in training/config.py.
Choices (dtype, device, attention.backend) are plain `str` checked there too: OmegaConf's Enum
fields would put Enum objects, not strings, into checkpoints and the wandb config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


@dataclass
class NaiveAttention:
    name: str = MISSING
    window: Optional[int] = MISSING


@dataclass
class SdpaAttention:
    name: str = MISSING
    window: Optional[int] = MISSING
    backend: str = MISSING


@dataclass
class FlashAttention:
    name: str = MISSING
    window: Optional[int] = MISSING
    deterministic: Any = MISSING  # auto | true | false: a union OmegaConf cannot type; model/attention.py checks it


@dataclass
class Model:
    name: str = MISSING
    n_layer: int = MISSING
    n_head: int = MISSING
    n_embd: int = MISSING
    vocab_size: Optional[int] = MISSING
    dropout: float = MISSING
    bias: bool = MISSING
    position: str = MISSING
    rope_base: float = MISSING


@dataclass
class Tokenized:
    """What every tokenized corpus (stdlib, text, hf) shares."""

    name: str = MISSING
    source: str = MISSING
    val_fraction: float = MISSING
    vocab_size: int = MISSING
    min_frequency: int = MISSING
    num_proc: Optional[int] = MISSING
    document_mask: bool = MISSING
    reset_positions: bool = MISSING


@dataclass
class StdlibData(Tokenized):
    exclude: list[str] = MISSING
    max_files: Optional[int] = MISSING
    max_bytes: Optional[int] = MISSING


@dataclass
class TextData(Tokenized):
    paths: list[str] = MISSING
    max_files: Optional[int] = MISSING
    max_bytes: Optional[int] = MISSING


@dataclass
class HubData(Tokenized):
    dataset: str = MISSING
    config: Optional[str] = MISSING
    split: str = MISSING
    text_field: str = MISSING
    max_docs: Optional[int] = MISSING
    connect_timeout_s: float = MISSING


@dataclass
class SyntheticData:
    name: str = MISSING
    source: str = MISSING
    vocab_size: int = MISSING
    num_tokens: int = MISSING
    document_mask: bool = MISSING
    reset_positions: bool = MISSING


@dataclass
class NoLogger:
    name: str = MISSING


@dataclass
class WandbLogger:
    name: str = MISSING
    project: str = MISSING
    entity: Optional[str] = MISSING
    mode: str = MISSING
    group: Optional[str] = MISSING
    tags: list[str] = MISSING
    quiet: bool = MISSING


@dataclass
class TrainConfig:
    """configs/config.yaml: the groups (typed by their own schemas) and the top-level keys."""

    attention: Any = MISSING
    model: Model = MISSING
    data: Any = MISSING
    logger: Any = MISSING
    seq_len: int = MISSING
    tokens_per_step: int = MISSING
    batch_size: Optional[int] = MISSING
    grad_accum: int = MISSING
    steps: int = MISSING
    stop_at: Optional[int] = MISSING
    lr: float = MISSING
    min_lr: float = MISSING
    warmup_steps: int = MISSING
    weight_decay: float = MISSING
    beta1: float = MISSING
    beta2: float = MISSING
    grad_clip: float = MISSING
    skip_nonfinite_steps: bool = MISSING
    dtype: str = MISSING
    compile: Union[bool, str] = MISSING
    checkpointing: str = MISSING
    loss_chunk: int = MISSING
    device: str = MISSING
    parallel: str = MISSING
    context_parallel: int = MISSING
    dist_timeout_s: float = MISSING
    seed: int = MISSING
    eval_every: int = MISSING
    eval_steps: int = MISSING
    ckpt_every: int = MISSING
    resume: Union[bool, str] = MISSING
    log_every: int = MISSING
    peak_tflops: Optional[float] = MISSING
    profile: bool = MISSING
    cache_dir: str = MISSING
    out_dir: str = MISSING


def register() -> None:
    """Put the schemas into Hydra's ConfigStore (idempotent); the YAML files' defaults lists name them.
    Also `${run_name:}`, which names run folders as training.metrics.run_name names runs."""
    from training.metrics import run_name

    OmegaConf.register_new_resolver("run_name", lambda *, _root_: run_name(_root_), replace=True)
    cs = ConfigStore.instance()
    cs.store(group="schema", name="train", node=TrainConfig)
    for group, schemas in {
        "attention": {"naive": NaiveAttention, "sdpa": SdpaAttention, "flash": FlashAttention},
        "model": {"gpt": Model},
        "data": {"stdlib": StdlibData, "text": TextData, "hf": HubData, "synthetic": SyntheticData},
        "logger": {"none": NoLogger, "wandb": WandbLogger},
    }.items():
        for name, node in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=node)


register()
