"""lowvram-gen: Stable Diffusion and VQGAN-CLIP on GPUs that are too small for them.

    from lowvram_gen import GenerationRequest, generate
    result = generate(GenerationRequest(prompt="a lighthouse at dusk", model="tiny"))
    print(result.images, result.preset, result.attempts)

Importing the package loads neither torch nor gradio: the heavy modules load on first use.
"""

from lowvram_gen.errors import LowVramError
from lowvram_gen.request import GenerationRequest

__version__ = "0.1.0"
__all__ = ["GenerationRequest", "GenerationResult", "LowVramError", "Session", "generate"]


def __getattr__(name: str):
    if name in ("generate", "Session", "GenerationResult"):
        from lowvram_gen import session

        return getattr(session, name)
    raise AttributeError(f"module 'lowvram_gen' has no attribute {name!r}")
