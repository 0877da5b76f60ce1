"""sparkbuild: reproducible, patched SGLang and vLLM images for NVIDIA DGX Spark."""

__version__ = "0.1.0"
