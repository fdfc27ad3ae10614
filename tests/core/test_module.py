"""The extension module itself: build flavour, errors, logging, headers."""

import os
import subprocess
import sys

import pytest
import torch

import pyccl


def test_cuda_build_matches_torch():
    # CUDA parts are built when torch has CUDA (and nvcc was found at build time).
    if torch.version.cuda is None:
        assert not pyccl._C.cuda_built()
    assert isinstance(pyccl.cuda_available(), bool)


def test_the_build_records_its_torch_and_another_torch_is_refused_at_import():
    """pyccl records the torch it was built against (pyccl/_build.py, written by the build) and refuses to load
    into another, naming both versions, before the C++ extension could fail with an undefined symbol."""
    assert pyccl._BUILT_FOR == torch.__version__
    with pytest.raises(ImportError, match=r"built for torch 2\.10\.0\+cu128, and this process has torch "
                                          r"2\.11\.0\+cu130.*torch==2\.10\.0"):
        pyccl._check_torch("2.10.0+cu128", "2.11.0+cu130")
    pyccl._check_torch(torch.__version__, torch.__version__)
    pyccl._check_torch(None, torch.__version__)  # a tree not built yet: importing _C says so
    run = subprocess.run([sys.executable, "-c", "import torch; torch.__version__ = '9.9.9'; import pyccl"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert run.returncode != 0
    assert f"pyccl was built for torch {torch.__version__}, and this process has torch 9.9.9" in run.stderr


def test_exception_hierarchy():
    assert issubclass(pyccl.InvalidArgumentError, ValueError)
    assert issubclass(pyccl.PycclTimeoutError, TimeoutError)
    for exc in (pyccl.InvalidArgumentError, pyccl.PycclTimeoutError, pyccl.AbortedError,
                pyccl.ClosedError, pyccl.CudaError, pyccl.UnsupportedError, pyccl.RemoteError):
        assert issubclass(exc, pyccl.PycclError) and issubclass(exc, RuntimeError)


def test_cpp_messages_reach_python_intact():
    with pytest.raises(pyccl.InvalidArgumentError) as info:
        pyccl._C.set_log_level("LOUD")
    assert str(info.value) == (
        "invalid argument 'level': unknown log level 'LOUD' (expected TRACE, DEBUG, INFO, WARN, ERROR or OFF)")


def test_log_level_from_environment():
    code = ("import torch, torch.distributed as dist, pyccl;"
            "c = pyccl.Communicator(dist.HashStore(), 0, 1, device='cpu', name='logtest'); c.close()")
    env = dict(os.environ, PYCCL_LOG_LEVEL="INFO")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "communicator 'logtest' ready: rank 0 of 1" in out.stderr
    env["PYCCL_LOG_LEVEL"] = "ERROR"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ready" not in out.stderr


def test_python_log_lines_print_where_the_level_is_set():
    """PYCCL_LOG_LEVEL=INFO prints the Python layer's info lines too (the
    logger had no handler, so only warnings came out); OFF silences them;
    unset, they go to the application's handlers only."""
    code = "from pyccl._logging import logger; logger.info('hello from python'); logger.error('an error line')"
    runs = {}
    for level in ("INFO", "OFF", None):
        env = {k: v for k, v in os.environ.items() if k != "PYCCL_LOG_LEVEL"}
        if level:
            env["PYCCL_LOG_LEVEL"] = level
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        runs[level] = out.stderr
    assert "INFO" in runs["INFO"] and "hello from python" in runs["INFO"], runs["INFO"]
    assert runs["INFO"].count("an error line") == 1 and "[pyccl " in runs["INFO"], runs["INFO"]
    assert "hello" not in runs["OFF"] and "an error line" not in runs["OFF"], runs["OFF"]
    assert "hello" not in runs[None] and "an error line" in runs[None], runs[None]


def test_public_headers_are_found():
    inc = pyccl.get_include()
    for header in ("device_common.hpp", "semaphore_device.hpp"):
        assert os.path.isfile(os.path.join(inc, "channels", header)), inc


def test_module_does_not_link_libcuda():
    so = pyccl._C.__file__
    out = subprocess.run(["ldd", so], capture_output=True, text=True)
    assert "libcuda.so" not in out.stdout, out.stdout
