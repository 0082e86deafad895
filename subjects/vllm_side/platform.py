"""The GPU platform a CPU cannot report, modelled: vLLM's own
``CudaPlatformBase`` answering as an SM90 device with the FlashAttention
backend.  vLLM's configuration code (``EngineArgs.create_engine_config``,
``update_block_size_for_backend``, the model registry) reads the platform;
on a CPU-only machine vLLM would pick its CPU platform, whose hooks need
triton-cpu and choose other block sizes than a GPU deployment gets.  Every
verdict built on it says the platform was modelled (``PLATFORM_NOTE``)."""

import importlib
import sys

__all__ = ["preimport", "install_sm90_platform", "PLATFORM_NOTE"]

PLATFORM_NOTE = ("vllm.platforms.cuda.CudaPlatformBase reporting SM90, FlashAttentionBackend as every attention "
                 "layer's backend, the model registry's class inspection run in-process (a CPU cannot report a "
                 "GPU; Blackwell (FA4) or FlashInfer GDN prefill could align blocks differently)")


def preimport(modules):
    """Import model and layer modules before the platform is swapped: under
    the CUDA stand-in some would compile kernels at import time."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a module this release does not have
            print(f"kvspec: cannot import {name}: {exc!r}"[:200], file=sys.stderr)


def install_sm90_platform():
    """Make the SM90 stand-in vLLM's current platform (in every module that
    already holds the old one); returns it and the attention backend class."""
    import vllm.platforms as platforms
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    class SM90StandIn(cuda.CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(9, 0)

        @classmethod
        def get_device_name(cls, device_id=0):
            return "kvspec SM90 stand-in"

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return 80 << 30

        @classmethod
        def is_fully_connected(cls, device_ids):
            return True

        @classmethod
        def device_count(cls):
            return 8

        @classmethod
        def _find_non_ssm_backends(cls, vllm_config):  # 0.33+
            return [FlashAttentionBackend]

        @classmethod
        def _find_non_ssm_backend(cls, vllm_config):  # 0.28-0.32
            return FlashAttentionBackend

    # The model registry inspects a model class in a child interpreter "to
    # avoid initializing CUDA"; that child could not import the subject tree
    # (it is on this process's sys.path only), and there is no CUDA here.
    from vllm.model_executor.models import registry

    if hasattr(registry, "_run_in_subprocess"):
        registry._run_in_subprocess = lambda fn: fn()
    previous = platforms._current_platform
    platforms._current_platform = SM90StandIn()
    for module in list(sys.modules.values()):
        try:
            if previous is not None and getattr(module, "current_platform", None) is previous:
                module.current_platform = platforms._current_platform
        except Exception:
            pass
    return platforms._current_platform, FlashAttentionBackend
