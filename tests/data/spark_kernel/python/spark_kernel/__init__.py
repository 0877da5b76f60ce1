"""sparkbuild test data: a CUDA extension (needs a GPU to run its kernel, not to import)."""
