"""The package's metadata: the distribution's name, one version, and the torch the wheel requires."""

import importlib.util
import os
import sys

import pytest
import torch

import pyccl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _build_metadata():
    spec = importlib.util.spec_from_file_location("build_metadata", os.path.join(ROOT, "scripts", "build_metadata.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_wheel_requires_the_torch_release_it_is_built_with():
    deps = _build_metadata().dynamic_metadata("dependencies", {})
    assert deps[0] == f"torch=={torch.__version__.split('+')[0]}", deps
    with pytest.raises(RuntimeError, match="dependencies"):
        _build_metadata().dynamic_metadata("version", {})


def test_one_version_and_a_free_name():
    project = _pyproject()["project"]
    assert project["name"] == "pyccl-gpu"  # PyPI's "pyccl" is another project
    assert "version" not in project and "version" in project["dynamic"]
    assert _pyproject()["tool"]["scikit-build"]["metadata"]["version"]["input"] == "src/pyccl/__init__.py"
    assert pyccl.__version__.count(".") == 2


def test_the_isolated_build_gets_the_pinned_torch():
    requires = _pyproject()["build-system"]["requires"]
    pins = [r for r in requires if r.startswith("torch")]
    assert len(pins) == 1 and pins[0].startswith("torch=="), requires


def test_build_info_names_the_architectures_in_one_string():
    archs = pyccl._C.build_info()["archs"]
    assert ";" not in archs, archs
