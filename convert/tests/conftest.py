"""Shared fixtures: tiny random models built in the test session (model-free suites need nothing else)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from a2d_convert.init_model import init_model
from a2d_convert.tiny import TinySpec, make_tiny_base

# Tiny models run fastest on one thread, and the test machine's cores are shared.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """make(name, spec, **init_args) -> (base_dir, a2d_dir), built once per name per session."""
    root = tmp_path_factory.mktemp("tiny")
    built: dict[str, tuple[Path, Path]] = {}

    def make(name: str, spec: TinySpec = TinySpec(), **init_args) -> tuple[Path, Path]:
        if name not in built:
            base = make_tiny_base(root / name / "base", spec)
            built[name] = (base, init_model(base, root / name / "a2d", **init_args))
        return built[name]

    return make


@pytest.fixture(scope="session")
def llama_model(tiny_models) -> Path:
    """The default tiny llama (GQA 2:1, untied, padded vocab) as an a2d model, block size 4."""
    return tiny_models("llama")[1]
