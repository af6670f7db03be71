"""transformers + torch on a GGUF's weights: the independent reference of the parity tests and of
experiments/bench/sampler.py (test-only: not in the wheel). Imports torch, so nothing at run time
uses it.

    model, tensors = transformers_from_gguf(embedded_gguf_path())   # eval mode, float32
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def transformers_from_gguf(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """(transformers model in eval mode, its state dict) for the GGUF at `path`, dequantised to
    float32 by transformers' own GGUF loader.

    This is what `from_pretrained(dir, gguf_file=...)` does, minus its demand for `accelerate`,
    which the project does not otherwise need. Raises ValueError if any weight other than the
    tied head is left uninitialised.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import logging as hf_logging

    path = Path(path)
    hf_logging.disable_progress_bar()
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    with no_init_weights():  # every weight is overwritten below
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    return _holding(model, tensors, str(path)), tensors


def transformers_holding(config: Any, tensors: dict[str, Any], source: str) -> Any:
    """transformers' model of `config` (float32, eval mode) holding `tensors` (torch tensors or
    numpy arrays by Hugging Face name; the tied head may be absent). Raises ValueError naming
    `source` if any other weight is left uninitialised or a tensor is not used."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():  # every weight is overwritten by _holding
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return _holding(model, tensors, source)


def _holding(model: Any, tensors: dict[str, Any], source: str) -> Any:
    """`model` (eval mode) with `tensors` loaded and its head tied; see transformers_holding."""
    import numpy as np
    import torch

    result = model.load_state_dict({k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                    for k, v in tensors.items()}, strict=False)
    missing = [k for k in result.missing_keys if k != "lm_head.weight"]
    if missing or result.unexpected_keys:
        raise ValueError(f"{source}: transformers left {missing} uninitialised and did not use "
                         f"{result.unexpected_keys}")
    model.tie_weights()
    return model.eval()
