"""The environment of the processes that run code the farm does not trust.

Engine servers and eval harnesses run code that came with a build, often a pull
request's (``source: pr``); whatever is in their environment, that code can read and
send anywhere. The farm's driver and workers hold secrets in theirs (the store URL
with its password, the Ray, GitHub and Grafana tokens, the notification webhooks), so
such a process never inherits the worker's environment: it gets an explicit one.

The rule, in one place:

1. From the worker's environment, only what an engine or a harness needs: the
   basics (``PATH``, ``HOME``, locale, ``TMPDIR``, CA bundles, proxies, the dynamic
   loader's paths and ``PYTHONPATH``, which CANN's ``set_env.sh`` extends), device
   visibility, and the settings of the libraries engines are made of (``HF_*``,
   ``VLLM_*``, ``SGLANG_*``, ``TORCH*``, ``OMP_*``, CANN's ``ASCEND_*``, ...).
2. Of those, never a name that looks like a secret (``*TOKEN*``, ``*SECRET*``,
   ``*PASSWORD*``, ``*_KEY``, ...; :func:`farm.masking.looks_secret`) nor any
   ``FARM_*`` variable: ``HF_TOKEN`` set on the machine stays there.
3. Then what the job sets explicitly for the process (an engine's ``env``, a
   harness's ``env``, the adapter's device list), which wins, secret-looking or not:
   a job that needs ``HF_TOKEN`` in its engine says so in its file.

A variable the engine needs that the rule drops belongs in the job's ``env``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from farm.masking import looks_secret

__all__ = ["child_environment"]

# Exact names passed on from the worker's environment.
_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TZ",
        "LANG",
        "LANGUAGE",
        "TMPDIR",
        "TEMP",
        "TMP",
        # The dynamic loader and Python paths: CANN, tcmalloc / iomp for vLLM's CPU build.
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        # torch.compile builds C++ kernels on CPU.
        "CC",
        "CXX",
        # Downloads (a harness's datasets) behind a proxy or a private CA.
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        # CANN's set_env.sh and torch_npu settings without a common prefix.
        "TOOLCHAIN_HOME",
        "TASK_QUEUE_ENABLE",
    }
)
# Name prefixes passed on: locale, caches, and the libraries engines are made of.
_PREFIXES = (
    "LC_",
    "XDG_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "VLLM_",
    "SGLANG_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "OMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    # Devices and their collective libraries (Ray sets *_VISIBLE_DEVICES per task).
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "ASCEND_",
    "ACL_",
    "ATB_",
    "ASDOPS_",
    "HCCL_",
    "NPU_",
    "CANN_",
)


def _needed(name: str) -> bool:
    return name in _NAMES or name.startswith(_PREFIXES)


def child_environment(
    explicit: Mapping[str, str], inherited: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The whole environment of an engine or harness process.

    ``inherited`` (default: this process's environment) filtered by the module's
    rule, then ``explicit`` (the job's and the adapter's variables) on top.
    """
    source = os.environ if inherited is None else inherited
    env = {k: v for k, v in source.items() if _needed(k) and not looks_secret(k)}
    env.update(explicit)
    return env
