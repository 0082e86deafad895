"""kvspec: a formal model and differential tester for vLLM's prefix-cache
registration boundary (``HybridKVCacheCoordinator.cache_blocks``)."""

__version__ = "0.1.0"
