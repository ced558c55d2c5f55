"""Exact speculative Jacobi decoding (SJD) and speculative coupled decoding (SCD)
for autoregressive image models.  ComfyUI-free; the node pack is a thin layer on top."""

__version__ = "0.1.0"  # the release; pyproject.toml's [project] version must match (tests/test_registry.py)

from .jobs.batching import generate_many
from .models.weights.checkpoints import ModelLoadError
from .decoding.config import COUPLERS, DRAFT_INITS, VERIFICATIONS, SamplerConfig
from .decoding.engine import GenerationCancelled, GenerationResult, IterationStats, ModelOutputError, generate
from .models.loading import load_model
from .models.decoder_settings import set_decoding
from .models.two_stage import keep_stages_apart
# prompts whose image size the model writes itself, per run (what the families that do so offer)
from .models.families.emu3p5_auto import auto_size as own_size_prompt, for_run as prompt_for_run
from .model import Session, TokenModel

__all__ = ["COUPLERS", "DRAFT_INITS", "GenerationCancelled", "GenerationResult", "IterationStats",
           "ModelLoadError", "ModelOutputError", "SamplerConfig", "Session", "TokenModel", "VERIFICATIONS",
           "generate", "generate_many", "keep_stages_apart", "load_model", "own_size_prompt", "prompt_for_run",
           "set_decoding"]
